--[[ quota_take: one owner's creations per second, as a leaky bucket (a counter that drains).

KEYS[1] bucket HASH: level = creations not yet drained (float), ms = when it was drained to
ARGV[1] limit per second   ARGV[2] now_ms   ARGV[3] creations wanted (n >= 1)
Returns: {wait_ms, level}: wait_ms 0 when the n creations were taken (the level after them),
else how long until they would be (the level as it is, unchanged).

The level drains at ``limit`` per second. A request fits when the level plus its n stays within
one second's worth; a request larger than that on its own fits only an empty bucket and fills it
past the top, so the owner's next request waits until the excess has drained: the average never
exceeds the limit, and a large bulk is admitted rather than refused for ever.
]]

local limit, now, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'level', 'ms')
local level, at = tonumber(state[1]) or 0, tonumber(state[2]) or now
if now > at then
  level = math.max(0, level - (now - at) * limit / 1000)
  at = now
end
local over = level + math.min(n, limit) - limit
if over > 0 then
  return {math.max(1, math.ceil(over * 1000 / limit)), math.floor(level)}
end
level = level + n
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ms', tostring(at))
-- Empty again after level / limit seconds: the key may go then.
redis.call('PEXPIRE', KEYS[1], math.ceil(level * 1000 / limit) + 1000)
return {0, math.floor(level)}
