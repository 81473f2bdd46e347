--[[ workers_prune: forget workers whose last heartbeat is older than a cutoff.

KEYS[1] workers beats (ZSET)   KEYS[2] workers info (HASH)
ARGV[1] cutoff_ms   ARGV[2] limit
Returns: the number of workers forgotten.
]]

local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #gone == 0 then return 0 end
redis.call('ZREM', KEYS[1], unpack(gone))
redis.call('HDEL', KEYS[2], unpack(gone))
return #gone
