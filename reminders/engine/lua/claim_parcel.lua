--[[ claim_parcel: move up to LIMIT due jobs from store into one in-flight parcel (phase one of
two, for topics whose handler hands whole batches on: coupon reminders).

KEYS[1] store   KEYS[2] prepare   KEYS[3] meta   KEYS[4] lease   KEYS[5] parcels
ARGV[1] lease token   ARGV[2] now_ms   ARGV[3] limit   ARGV[4] visibility_ms
Returns: {-1} when the lease no longer holds our token (nothing moved);
         {0} when nothing is due;
         {0, n, parcel id, the n ids joined by ",", i1, attempt1, i2, attempt2, ...} otherwise,
         oldest due first; (index, attempt) pairs (index from 1) for the ids past their first
         attempt, every other one is on attempt 1.
Where claim_due writes one prepare entry per job, this writes one per batch: the prepare entry
"#<parcel id>" (score = (now + visibility) * 1000 + 1) and the field <parcel id> of the parcels
hash holding the ids. In the same hash "#seq" numbers the parcels (from the claim time in ms
when the hash is new) and "#n" counts the ids in them (the slot's in-flight figure). A job past its first attempt has its attempt in meta
("a:<id>"), where claim_due keeps it in the prepare score. Job ids never contain ",".
A parcel leaves by settle_parcel, or by reap once its visibility deadline passed.
]]
-- @include common

if not fence_ok(KEYS[4], ARGV[1]) then return {-1} end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local n = #ids
if n == 0 then return {0} end
-- The range started at -inf, so the rows are exactly ranks 0..n-1: one O(log N + n) removal.
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
local retries = {}
if redis.call('EXISTS', KEYS[3]) == 1 then  -- the common case, no meta at all, reads none
  local previous = attempts_of(KEYS[3], ids)
  for i = 1, n do
    if previous[i] > 0 then
      local attempt = math.min(previous[i] + 1, 999)
      redis.call('HSET', KEYS[3], 'a:' .. ids[i], attempt)
      retries[#retries + 1] = i
      retries[#retries + 1] = attempt
    end
  end
end
local packed = table.concat(ids, ',')
local parcel = redis.call('HINCRBY', KEYS[5], '#seq', 1)
if parcel == 1 then
  -- The slot's first parcel, or the first since Redis lost its data: numbered from now (ms),
  -- so no id is given again to another parcel while a deliverer may still hold one issued
  -- before the loss (its settle would settle the new parcel instead).
  parcel = math.floor(tonumber(ARGV[2]))
  redis.call('HSET', KEYS[5], '#seq', parcel)
end
redis.call('HSET', KEYS[5], parcel, packed)
redis.call('HINCRBY', KEYS[5], '#n', n)
redis.call('ZADD', KEYS[2], fmt((tonumber(ARGV[2]) + tonumber(ARGV[4])) * 1000 + 1), '#' .. parcel)
local out = {0, n, parcel, packed}
for j = 1, #retries do out[4 + j] = retries[j] end
return out
