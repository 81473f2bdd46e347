-- Claims at the gate (couponcenter/coupons/gate.py), in order: refuse each, or reserve a unit.
-- KEYS[1] the gate hash, KEYS[2] users (user id -> claims), KEYS[3] held (hold -> ms reserved)
-- ARGV: per claim three values: user id, now (epoch ms, the caller's clock), the new hold's member
-- Returns {'missing'} (no gate: the callers go to PostgreSQL), else two values per claim:
-- 'cancelled', 'not_open' and opens_ms, 'closed' and closes_ms, 'limit_reached', 'sold_out'
-- (each with 0 when it names no moment), or 'pass' and seq: the unit is reserved and seq is the
-- user's claim number.
local gate = redis.call('HMGET', KEYS[1], 'opens_ms', 'closes_ms', 'cancelled', 'limit', 'stock',
  'taken', 'expires_ms')
if not gate[1] then
  return {'missing'}
end
local opens, closes = tonumber(gate[1]), tonumber(gate[2])
local limit, stock, taken = tonumber(gate[4]), tonumber(gate[5]), tonumber(gate[6])
-- The server's clock, not the callers': a rebuild tells holds from before its snapshot by it.
local time = redis.call('TIME')
local stamp = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local answers, passed = {}, false
for i = 1, #ARGV, 3 do
  local user, now = ARGV[i], tonumber(ARGV[i + 1])
  if gate[3] == '1' then
    answers[#answers + 1], answers[#answers + 2] = 'cancelled', 0
  elseif now < opens then
    answers[#answers + 1], answers[#answers + 2] = 'not_open', gate[1]
  elseif closes > 0 and now >= closes then
    answers[#answers + 1], answers[#answers + 2] = 'closed', gate[2]
  elseif tonumber(redis.call('HGET', KEYS[2], user) or '0') >= limit then
    answers[#answers + 1], answers[#answers + 2] = 'limit_reached', 0
  elseif taken >= stock then
    answers[#answers + 1], answers[#answers + 2] = 'sold_out', 0
  else
    taken = taken + 1
    local seq = redis.call('HINCRBY', KEYS[2], user, 1)
    redis.call('ZADD', KEYS[3], stamp, ARGV[i + 2])
    answers[#answers + 1], answers[#answers + 2] = 'pass', seq
    passed = true
  end
end
if passed then
  redis.call('HSET', KEYS[1], 'taken', taken)
  -- The first hold (or the first claim since the build) creates its key: it goes with the gate.
  for i = 2, 3 do
    if redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIREAT', KEYS[i], gate[7])
    end
  end
end
return answers
