--[[ reap: jobs whose visibility deadline passed (their worker died or hung) go back to store, due
now, or to dead once attempts reach the maximum.

KEYS[1] prepare   KEYS[2] store   KEYS[3] dead   KEYS[4] meta   KEYS[5] parcels
ARGV[1] now_ms   ARGV[2] limit   ARGV[3] max_attempts   ARGV[4] error text recorded for them
Returns: {retried, dead, id of each job that went dead...}.
A job sent back to store is marked a suspect ('s:<id>' in meta): the next claim takes it alone.
Deadline < now  <=>  score = deadline * 1000 + attempt < now * 1000, since attempt < 1000.
A parcel ("#<parcel id>", see claim_parcel) is reaped whole: each of its jobs as a job would be,
its attempt from meta ("a:<id>", 1 when absent). LIMIT counts jobs, and a parcel is taken whole,
so one call moves at most LIMIT jobs plus the rest of the last parcel it took (one batch).
]]
-- @include common

local now = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[3])
local limit = tonumber(ARGV[2])
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now * 1000), 'WITHSCORES', 'LIMIT', 0, limit)
local n = #rows / 2
if n == 0 then return {0, 0} end
local retried, dead = 0, 0
local dead_ids = {}

local function back(id, attempt)
  redis.call('HSET', KEYS[4], 'a:' .. id, attempt, 'e:' .. id, ARGV[4])
  if attempt >= max_attempts then
    redis.call('ZADD', KEYS[3], fmt(now), id)
    dead = dead + 1
    dead_ids[dead] = id
  else
    redis.call('ZADD', KEYS[2], fmt(now), id)
    redis.call('HSET', KEYS[4], 's:' .. id, 1)
    retried = retried + 1
  end
end

local taken, jobs = 0, 0
for i = 1, n do
  if jobs >= limit then break end
  taken = i
  local id = rows[2 * i - 1]
  if string.sub(id, 1, 1) == '#' then
    local parcel = string.sub(id, 2)
    local packed = redis.call('HGET', KEYS[5], parcel)
    if packed then
      redis.call('HDEL', KEYS[5], parcel)
      local count = 0
      for job in string.gmatch(packed, '[^,]+') do
        back(job, tonumber(redis.call('HGET', KEYS[4], 'a:' .. job)) or 1)
        count = count + 1
      end
      redis.call('HINCRBY', KEYS[5], '#n', -count)
      jobs = jobs + count
    end
  else
    back(id, tonumber(rows[2 * i]) % 1000)
    jobs = jobs + 1
  end
end
-- The range started at -inf, so the entries taken are exactly ranks 0..taken-1.
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, taken - 1)
local out = {retried, dead}
for i = 1, #dead_ids do out[i + 2] = dead_ids[i] end
return out
