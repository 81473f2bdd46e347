--[[ singleton_hold: take or keep a named lease for work exactly one worker should do.

KEYS[1] singleton key
ARGV[1] token   ARGV[2] ttl_ms
Returns: 1 we hold it (renewed or newly taken), 0 someone else does.
]]

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
