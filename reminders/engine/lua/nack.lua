--[[ nack: jobs failed; back to store after a backoff, or to dead once attempts reach the maximum.

KEYS[1] prepare   KEYS[2] store   KEYS[3] dead   KEYS[4] meta   KEYS[5] lease
ARGV[1] lease token   ARGV[2] now_ms   ARGV[3] max_attempts (0 buries every job)
ARGV[4] backoff base ms   ARGV[5] backoff cap ms   ARGV[6..] job_id, error pairs
Returns: {-1} when the lease no longer holds our token (nothing moved);
         {0, retried, dead, missing} otherwise (missing = not in prepare any more, e.g. reaped).
The attempt count is read from the prepare score (deadline * 1000 + attempt); it is kept in meta so
the next claim counts on from it. Backoff = min(cap, base * 2^(attempt - 1)). A nacked job was
answered for, so it is no longer a suspect (see claim_due).
]]
-- @include common

if not fence_ok(KEYS[5], ARGV[1]) then return {-1} end
local now = tonumber(ARGV[2])
local max_attempts = tonumber(ARGV[3])
local base, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local retried, dead, missing = 0, 0, 0
for i = 6, #ARGV, 2 do
  local id, err = ARGV[i], ARGV[i + 1]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if not score then
    missing = missing + 1
  else
    local attempt = tonumber(score) % 1000
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', KEYS[4], 'a:' .. id, attempt, 'e:' .. id, err)
    redis.call('HDEL', KEYS[4], 's:' .. id)
    if attempt >= max_attempts then
      redis.call('ZADD', KEYS[3], fmt(now), id)
      dead = dead + 1
    else
      local delay = math.min(cap, base * 2 ^ math.min(attempt - 1, 40))
      redis.call('ZADD', KEYS[2], fmt(now + delay), id)
      retried = retried + 1
    end
  end
end
return {0, retried, dead, missing}
