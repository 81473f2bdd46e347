--[[ enqueue: put jobs in a slot's schedule, scored by due time: in store, or in later when they
fall due after LATER_AFTER (see promote).

KEYS[1] store   KEYS[2] prepare   KEYS[3] dead   KEYS[4] meta   KEYS[5] later
ARGV[1] mode: "upsert" (schedule or reschedule: sets the due time, in whichever of store and
        later it belongs, takes the job out of the other and out of the dead set, and forgets
        its attempts; an in-flight copy in prepare is left alone) or "nx" (rebuild: only jobs
        found in none of store, later, prepare, dead are added)
ARGV[2] later_after_ms: jobs due after this go to later; -1: every job goes to store
ARGV[3..] due_ms, job_id pairs
Returns: the number of jobs newly added to the schedule (a job moved between store and later is
not new).
]]
-- @include common

local mode = ARGV[1]
local later_after = tonumber(ARGV[2])
local near, far = {}, {}  -- due_ms, job_id pairs for store and for later
local near_ids, far_ids = {}, {}
for i = 3, #ARGV, 2 do
  local due, id = ARGV[i], ARGV[i + 1]
  local is_far = later_after >= 0 and tonumber(due) > later_after
  if mode ~= 'nx' or (not redis.call('ZSCORE', KEYS[2], id) and not redis.call('ZSCORE', KEYS[3], id)
                      and not redis.call('ZSCORE', is_far and KEYS[1] or KEYS[5], id)) then
    local pairs_out, ids_out = near, near_ids
    if is_far then pairs_out, ids_out = far, far_ids end
    pairs_out[#pairs_out + 1] = due
    pairs_out[#pairs_out + 1] = id
    ids_out[#ids_out + 1] = id
  end
end
if #near == 0 and #far == 0 then return 0 end

local function add_nx(key, pairs_in)
  local added = 0
  for i = 1, #pairs_in, 4000 do
    added = added + redis.call('ZADD', key, 'NX', unpack(pairs_in, i, math.min(i + 3999, #pairs_in)))
  end
  return added
end

if mode == 'nx' then
  return add_nx(KEYS[1], near) + add_nx(KEYS[5], far)
end

local all_ids = {}
for i = 1, #near_ids do all_ids[#all_ids + 1] = near_ids[i] end
for i = 1, #far_ids do all_ids[#all_ids + 1] = far_ids[i] end
if redis.call('ZCARD', KEYS[3]) > 0 then chunked('ZREM', KEYS[3], all_ids) end
forget(KEYS[4], all_ids)
local moved = 0  -- out of the other tier: rescheduled, not new
if #near_ids > 0 and redis.call('EXISTS', KEYS[5]) == 1 then
  moved = moved + chunked('ZREM', KEYS[5], near_ids)
end
if #far_ids > 0 then moved = moved + chunked('ZREM', KEYS[1], far_ids) end
local added = 0
if #near > 0 then added = added + chunked('ZADD', KEYS[1], near) end
if #far > 0 then added = added + chunked('ZADD', KEYS[5], far) end
return added - moved
