-- A hold that never reached a commit gives its unit back (couponcenter/coupons/gate.py).
-- KEYS[1] the gate hash, KEYS[2] users, KEYS[3] held; ARGV[1] user id, ARGV[2] the hold
-- Only a hold still held is counted in the gate: one a rebuild dropped gives nothing back.
-- Returns 1 when the unit came back, else 0.
if redis.call('ZREM', KEYS[3], ARGV[2]) == 0 then
  return 0
end
if redis.call('HEXISTS', KEYS[1], 'taken') == 1 then
  redis.call('HINCRBY', KEYS[1], 'taken', -1)
end
if redis.call('HINCRBY', KEYS[2], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
