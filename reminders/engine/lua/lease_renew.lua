--[[ lease_renew: compare-and-pexpire; extend a lease only while it still holds our token.

KEYS[1] lease (a slot lease or a singleton)
ARGV[1] token   ARGV[2] ttl_ms
Returns: 1 renewed, 0 lost (expired, or someone else holds it).
]]

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
