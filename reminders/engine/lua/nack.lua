--[[ nack: jobs failed; back to store after a backoff, or to dead once attempts reach the maximum.

KEYS[1] prepare   KEYS[2] store   KEYS[3] dead   KEYS[4] meta   KEYS[5] lease
ARGV[1] lease token   ARGV[2] now_ms   ARGV[3] max_attempts (0 buries every job)
ARGV[4] backoff base ms   ARGV[5] backoff cap ms   ARGV[6..] job_id, error pairs
Returns: {-1} when the lease no longer holds our token (nothing moved);
         {0, retried, dead, missing} otherwise (missing = not in prepare any more, e.g. reaped).
The attempt count is read from the prepare score (deadline * 1000 + attempt); it is kept in meta so
the next claim counts on from it. Retry, backoff and dead: includes/retry.lua (a nacked job was
answered for, so it is no longer a suspect; see claim_due).
]]
-- @include common
-- @include retry

if not fence_ok(KEYS[5], ARGV[1]) then return {-1} end
local policy = retry_policy()
local missing = 0
for i = 6, #ARGV, 2 do
  local id, err = ARGV[i], ARGV[i + 1]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if not score then
    missing = missing + 1
  else
    redis.call('ZREM', KEYS[1], id)
    retry_or_bury(policy, id, err, tonumber(score) % 1000)
  end
end
return {0, policy.retried, policy.died, missing}
