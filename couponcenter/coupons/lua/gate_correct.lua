-- PostgreSQL refused a claim the gate let through: the gate learns it (couponcenter/coupons/gate.py).
-- KEYS[1] the gate hash, KEYS[2] users
-- ARGV[1] 'sold_out' (taken = max(taken, stock)) or 'user_full' (users[u] = max(users[u], limit)),
-- ARGV[2] the user id (for 'user_full')
-- Returns 1 when the gate changed, else 0 (no gate, or it knew already).
local gate = redis.call('HMGET', KEYS[1], 'stock', 'taken', 'limit', 'expires_ms')
if not gate[1] then
  return 0
end
if ARGV[1] == 'sold_out' then
  if tonumber(gate[2]) >= tonumber(gate[1]) then
    return 0
  end
  redis.call('HSET', KEYS[1], 'taken', gate[1])
  return 1
end
if tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0') >= tonumber(gate[3]) then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[2], gate[3])
if redis.call('PTTL', KEYS[2]) == -1 then
  redis.call('PEXPIREAT', KEYS[2], gate[4])
end
return 1
