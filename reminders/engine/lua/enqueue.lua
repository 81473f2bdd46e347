--[[ enqueue: put jobs in a slot's store, scored by due time.

KEYS[1] store   KEYS[2] prepare   KEYS[3] dead   KEYS[4] meta
ARGV[1] mode: "upsert" (schedule or reschedule: sets the due time, takes the job out of the dead
        set and forgets its attempts; an in-flight copy in prepare is left alone) or "nx" (rebuild:
        only jobs found in none of store, prepare, dead are added)
ARGV[2..] due_ms, job_id pairs
Returns: the number of jobs newly added to the store.
]]
-- @include common

local mode = ARGV[1]
local pairs_in = {}
local ids = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i + 1]
  if mode ~= 'nx' or (not redis.call('ZSCORE', KEYS[2], id) and not redis.call('ZSCORE', KEYS[3], id)) then
    pairs_in[#pairs_in + 1] = ARGV[i]
    pairs_in[#pairs_in + 1] = id
    ids[#ids + 1] = id
  end
end
if #pairs_in == 0 then return 0 end

if mode == 'nx' then
  local added = 0
  for i = 1, #pairs_in, 4000 do
    added = added + redis.call('ZADD', KEYS[1], 'NX', unpack(pairs_in, i, math.min(i + 3999, #pairs_in)))
  end
  return added
end

if redis.call('ZCARD', KEYS[3]) > 0 then chunked('ZREM', KEYS[3], ids) end
forget(KEYS[4], ids)
return chunked('ZADD', KEYS[1], pairs_in)
