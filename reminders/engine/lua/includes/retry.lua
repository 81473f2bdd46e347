-- The retry policy of a failed job, shared by nack and settle_parcel; pasted in after common (it
-- uses fmt). The job's attempt and error are kept in meta, and it is no longer a suspect (it was
-- answered for). It goes back to store after a backoff of min(cap, base * 2^(attempt - 1)), or to
-- dead once its attempts reach the maximum.
-- `policy`: {store = key, dead = key, meta = key, now = ms, max_attempts = n, base = ms, cap = ms,
-- retried = n, died = n}; the last two count what it did, for the script's reply.
local function retry_or_bury(policy, id, err, attempt)
  redis.call('HSET', policy.meta, 'a:' .. id, attempt, 'e:' .. id, err)
  redis.call('HDEL', policy.meta, 's:' .. id)
  if attempt >= policy.max_attempts then
    redis.call('ZADD', policy.dead, fmt(policy.now), id)
    policy.died = policy.died + 1
    return
  end
  local delay = math.min(policy.cap, policy.base * 2 ^ math.min(attempt - 1, 40))
  redis.call('ZADD', policy.store, fmt(policy.now + delay), id)
  policy.retried = policy.retried + 1
end

-- The policy of a script whose KEYS[2..4] are store, dead, meta and whose ARGV[2..5] are now_ms,
-- max_attempts, backoff base ms and backoff cap ms (nack's and settle_parcel's layout).
local function retry_policy()
  return {
    store = KEYS[2], dead = KEYS[3], meta = KEYS[4], now = tonumber(ARGV[2]),
    max_attempts = tonumber(ARGV[3]), base = tonumber(ARGV[4]), cap = tonumber(ARGV[5]),
    retried = 0, died = 0,
  }
end
