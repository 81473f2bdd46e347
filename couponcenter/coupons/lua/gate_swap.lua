-- The end of a gate build (couponcenter/coupons/gate.py): swap in what PostgreSQL said.
-- KEYS[1] the gate hash, KEYS[2] users, KEYS[3] held, KEYS[4] the users' claim counts read from
-- PostgreSQL (absent when nobody claimed)
-- ARGV[1] mark: server ms read after the PostgreSQL snapshot was taken, ARGV[2] expires_ms,
-- ARGV[3] the units claimed in the snapshot, ARGV[4..] the gate's other fields and values
-- Holds reserved up to the mark may or may not be in the snapshot: they are dropped (a claim of
-- theirs that commits later is missed, so the gate admits a little more, and PostgreSQL is the
-- guard). Holds after the mark are in flight past the snapshot: counted on top of it.
-- Returns the number of holds kept.
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
local kept = redis.call('ZRANGE', KEYS[3], 0, -1)
redis.call('UNLINK', KEYS[2])
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('RENAME', KEYS[4], KEYS[2])
end
for _, hold in ipairs(kept) do
  redis.call('HINCRBY', KEYS[2], string.match(hold, '^([^:]+):'), 1)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'taken', tonumber(ARGV[3]) + #kept, 'built_ms', ARGV[1],
  'expires_ms', ARGV[2], unpack(ARGV, 4))
for i = 1, 3 do
  redis.call('PEXPIREAT', KEYS[i], ARGV[2])
end
return #kept
