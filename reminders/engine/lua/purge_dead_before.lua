--[[ purge_dead_before: delete for good, with their meta, the dead jobs that died before a moment
(the dead letters' retention). Read and removed in one step: a job requeued meanwhile is not in
the dead set any more and keeps its meta.

KEYS[1] dead   KEYS[2] meta
ARGV[1] died before (epoch ms, exclusive)   ARGV[2] limit
Returns: the number of jobs deleted (fewer than the limit: none older is left).
]]
-- @include common

local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then return 0 end
local removed = chunked('ZREM', KEYS[1], ids)
forget(KEYS[2], ids)
return removed
