--[[ reap: jobs whose visibility deadline passed (their worker died or hung) go back to store, due
now, or to dead once attempts reach the maximum.

KEYS[1] prepare   KEYS[2] store   KEYS[3] dead   KEYS[4] meta
ARGV[1] now_ms   ARGV[2] limit   ARGV[3] max_attempts   ARGV[4] error text recorded for them
Returns: {retried, dead, id of each job that went dead...}.
A job sent back to store is marked a suspect ('s:<id>' in meta): the next claim takes it alone.
Deadline < now  <=>  score = deadline * 1000 + attempt < now * 1000, since attempt < 1000.
]]
-- @include common

local now = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[3])
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now * 1000), 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local n = #rows / 2
if n == 0 then return {0, 0} end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
local retried, dead = 0, 0
local dead_ids = {}
for i = 1, n do
  local id = rows[2 * i - 1]
  local attempt = tonumber(rows[2 * i]) % 1000
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
local out = {retried, dead}
for i = 1, #dead_ids do out[i + 2] = dead_ids[i] end
return out
