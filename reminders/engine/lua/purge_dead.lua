--[[ purge_dead: delete dead jobs for good, with their meta.

KEYS[1] dead   KEYS[2] meta
ARGV[1] limit   ARGV[2..] job ids (none: the LIMIT oldest dead jobs)
Returns: the number of jobs deleted.
]]
-- @include common

local limit = tonumber(ARGV[1])
local ids = {}
if #ARGV >= 2 then
  for i = 2, math.min(#ARGV, limit + 1) do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, limit - 1)
end
if #ids == 0 then return 0 end
local removed = chunked('ZREM', KEYS[1], ids)
forget(KEYS[2], ids)
return removed
