--[[ claim_due: move up to LIMIT due jobs from store to prepare (phase one of two).

KEYS[1] store   KEYS[2] prepare   KEYS[3] meta   KEYS[4] lease
ARGV[1] lease token   ARGV[2] now_ms   ARGV[3] limit   ARGV[4] visibility_ms
ARGV[5] "1" to return due times, "0" to skip them (WITHSCORES is the costliest part of a claim)
ARGV[6] "1" to claim suspects alone (see below), "0" to treat them like any entry
Returns: {-1} when the lease no longer holds our token (nothing moved);
         {s, n, id1 .. idn, [due1 .. duen,] i1, attempt1, i2, attempt2, ...} otherwise, oldest due
         first: the n ids, their store scores (only when asked for), then (index, attempt) pairs
         for the entries past their first attempt (index from 1); every other entry is on attempt 1.
         Compact on purpose: a burst claims 200,000 entries, almost all on their first attempt.
         s = 0, or 1 when the batch is one suspect claimed alone.
With ARGV[6] = "1", suspects (the reaper brought them back: whoever handled them never answered,
and they may be what killed it) travel alone: a batch stops before the first suspect, and a suspect at the head
of the line is claimed by itself. So a poison pill dies alone; its batch-mates of the crash are
each retried alone once and then flow normally again.
Prepare score = (now + visibility) * 1000 + attempt, attempt counted from 1 (capped at 999).
]]
-- @include common

if not fence_ok(KEYS[4], ARGV[1]) then return {-1} end
local with_due = ARGV[5] == '1'
local limit = tonumber(ARGV[3])
local rows, step
if with_due then
  rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'WITHSCORES', 'LIMIT', 0, limit)
  step = 2
else
  rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, limit)
  step = 1
end
local n = #rows / step
if n == 0 then return {0} end

local ids = {}
for i = 1, n do ids[i] = rows[step * i - step + 1] end
local previous, suspect = attempts_of(KEYS[3], ids)
local status = 0
if ARGV[6] ~= '1' then
  -- suspects flow with the rest
elseif suspect[1] then
  n, status = 1, 1
else
  for i = 2, n do
    if suspect[i] then n = i - 1; break end
  end
end
-- The range started at -inf, so the rows are exactly ranks 0..n-1: one O(log N + n) removal.
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
local base = (tonumber(ARGV[2]) + tonumber(ARGV[4])) * 1000
local score_of = {}  -- attempt -> formatted prepare score; a batch shares one deadline
local out = {status, n}
local zargs = {}
local retries = {}
for i = 1, n do
  local attempt = math.min(previous[i] + 1, 999)
  local score = score_of[attempt]
  if not score then
    score = fmt(base + attempt)
    score_of[attempt] = score
  end
  zargs[2 * i - 1] = score
  zargs[2 * i] = ids[i]
  out[2 + i] = ids[i]
  if with_due then out[2 + n + i] = rows[2 * i] end
  if attempt > 1 then
    retries[#retries + 1] = i
    retries[#retries + 1] = attempt
  end
end
chunked('ZADD', KEYS[2], zargs)
local tail = #out
for j = 1, #retries do out[tail + j] = retries[j] end
return out
