--[[ settle_parcel: a deliverer is done with a parcel (phase two): the parcel leaves prepare; its
failed jobs go back to store after a backoff, or to dead once attempts reach the maximum; the
rest are done.

KEYS[1] prepare   KEYS[2] store   KEYS[3] dead   KEYS[4] meta   KEYS[5] parcels
ARGV[1] parcel id   ARGV[2] now_ms   ARGV[3] max_attempts   ARGV[4] backoff base ms
ARGV[5] backoff cap ms   ARGV[6..] job_id, error pairs of the failed jobs
Returns: {0, retried, dead, missing}: missing = 1 when the parcel is no longer in flight (the
reaper took it back after its visibility deadline: its jobs are in store or dead already, and
nothing is done here). Failed ids that are not in the parcel are ignored.
Not fenced (as acks of handed-on entries are not): the lease holder handed the parcel on.
A job's attempt is "a:<id>" in meta, or 1 when it has none (see claim_parcel); retry, backoff and
dead as nack's (includes/retry.lua).
]]
-- @include common
-- @include retry

local parcel = ARGV[1]
local packed = redis.call('HGET', KEYS[5], parcel)
if not packed then return {0, 0, 0, 1} end
local n = select(2, string.gsub(packed, ',', ',')) + 1
redis.call('HDEL', KEYS[5], parcel)
redis.call('HINCRBY', KEYS[5], '#n', -n)
redis.call('ZREM', KEYS[1], '#' .. parcel)

local policy = retry_policy()
local inside, failed = nil, {}
for i = 6, #ARGV, 2 do
  if not inside then
    inside = {}
    for id in string.gmatch(packed, '[^,]+') do inside[id] = true end
  end
  local id, err = ARGV[i], ARGV[i + 1]
  if inside[id] and not failed[id] then
    failed[id] = true
    local attempt = tonumber(redis.call('HGET', KEYS[4], 'a:' .. id)) or 1
    retry_or_bury(policy, id, err, attempt)
  end
end
if redis.call('EXISTS', KEYS[4]) == 1 then  -- the jobs done forget their attempts
  local done = {}
  for id in string.gmatch(packed, '[^,]+') do
    if not failed[id] then done[#done + 1] = id end
  end
  forget(KEYS[4], done)
end
return {0, policy.retried, policy.died, 0}
