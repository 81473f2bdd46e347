--[[ requeue_dead: dead jobs back to store, due now, with their attempts reset.

KEYS[1] dead   KEYS[2] store   KEYS[3] meta
ARGV[1] now_ms   ARGV[2] limit   ARGV[3..] job ids (none: the LIMIT oldest dead jobs)
Returns: the number of jobs moved.
]]
-- @include common

local limit = tonumber(ARGV[2])
local ids = {}
if #ARGV >= 3 then
  for i = 3, math.min(#ARGV, limit + 2) do
    if redis.call('ZSCORE', KEYS[1], ARGV[i]) then ids[#ids + 1] = ARGV[i] end
  end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, limit - 1)
end
if #ids == 0 then return 0 end
local zargs = {}
local now = fmt(tonumber(ARGV[1]))
for i = 1, #ids do
  zargs[#zargs + 1] = now
  zargs[#zargs + 1] = ids[i]
end
chunked('ZREM', KEYS[1], ids)
chunked('ZADD', KEYS[2], zargs)
forget(KEYS[3], ids)
return #ids
