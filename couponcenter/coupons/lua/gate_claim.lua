-- One claim at the gate (couponcenter/coupons/gate.py): refuse it, or reserve a unit for it.
-- KEYS[1] the gate hash, KEYS[2] users (user id -> claims), KEYS[3] held (hold -> ms reserved)
-- ARGV[1] user id, ARGV[2] now (epoch ms, the caller's clock), ARGV[3] the new hold's member
-- Returns {'missing'} (no gate: the caller goes to PostgreSQL), {'cancelled'},
-- {'not_open', opens_ms}, {'closed', closes_ms}, {'limit_reached'}, {'sold_out'},
-- or {'pass', seq}: the unit is reserved and seq is the user's claim number.
local gate = redis.call('HMGET', KEYS[1], 'opens_ms', 'closes_ms', 'cancelled', 'limit', 'stock',
  'taken', 'expires_ms')
if not gate[1] then
  return {'missing'}
end
if gate[3] == '1' then
  return {'cancelled'}
end
local now = tonumber(ARGV[2])
if now < tonumber(gate[1]) then
  return {'not_open', gate[1]}
end
local closes = tonumber(gate[2])
if closes > 0 and now >= closes then
  return {'closed', gate[2]}
end
if tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') >= tonumber(gate[4]) then
  return {'limit_reached'}
end
if tonumber(gate[6]) >= tonumber(gate[5]) then
  return {'sold_out'}
end
redis.call('HINCRBY', KEYS[1], 'taken', 1)
local seq = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
-- The server's clock, not the caller's: a rebuild tells holds from before its snapshot by it.
local time = redis.call('TIME')
redis.call('ZADD', KEYS[3], tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000),
  ARGV[3])
-- The first hold (or the first claim since the build) creates its key: it goes with the gate.
for i = 2, 3 do
  if redis.call('PTTL', KEYS[i]) == -1 then
    redis.call('PEXPIREAT', KEYS[i], gate[7])
  end
end
return {'pass', seq}
