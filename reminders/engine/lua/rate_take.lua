--[[ rate_take: a token bucket shared by every worker (a topic's rate limit).

KEYS[1] bucket HASH: t = tokens (float), ms = when they were counted, throttled = due jobs held
        back by the limit (``rates.held_back``; tokens asked for are not jobs)
ARGV[1] rate per second   ARGV[2] burst (bucket size)   ARGV[3] now_ms   ARGV[4] wanted
ARGV[5] given back (unused tokens of an earlier take; 0 for a take)
Returns: the tokens granted (0..wanted), as an integer.

The bucket refills at ``rate`` per second up to ``burst``; the time is the caller's clock (the
workers' clocks agree to well under a tick). A grant is whole tokens; what a claim did not use
is given back with wanted = 0.
]]

local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, wanted, back = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 't', 'ms')
local tokens, at = tonumber(state[1]), tonumber(state[2])
if tokens == nil or at == nil then
  tokens, at = burst, now
end
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  at = now
end
tokens = math.min(burst, tokens + back)
local granted = math.min(wanted, math.floor(tokens))
if granted < 0 then granted = 0 end
tokens = tokens - granted
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'ms', tostring(at))
-- An idle bucket is full again after burst / rate seconds: it may go then.
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 60000)
return granted
