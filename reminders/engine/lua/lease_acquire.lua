--[[ lease_acquire: take a slot's lease if it is free, or keep it if we already hold it.

KEYS[1] lease   KEYS[2] fence
ARGV[1] holder (worker id)   ARGV[2] ttl_ms   ARGV[3] token we believe we hold ('' for none)
Returns: the token now held ("<fence>:<holder>", the fence INCR'd for every new lease so a stale
holder can never match again), or nil when another holder has it.
]]

local current = redis.call('GET', KEYS[1])
if current then
  if current == ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return current
  end
  return false
end
local token = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
