--[[ lease_release: compare-and-delete; give a lease up only if it still holds our token.

KEYS[1] lease (a slot lease or a singleton)
ARGV[1] token
Returns: 1 released, 0 it was not ours.
]]

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
