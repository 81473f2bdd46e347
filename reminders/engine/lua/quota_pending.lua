--[[ quota_pending: a topic's pending jobs as its quota counts them: a count the caller took from
the database, kept for a while and raised by every creation admitted meanwhile.

KEYS[1] count STRING (expires: the count is taken again then)
ARGV[1] limit   ARGV[2] n, creations wanted (negative: given back)   ARGV[3] "" or the count just
taken from the database (kept unless another caller's is)   ARGV[4] how long a count is kept (ms)
Returns {code, value}: 0 admitted, value = the count after them; 1 refused, value = ms until the
count is taken again; 2 no count kept: take one and call again with it.

Jobs that fire or are cancelled are not subtracted here: the count errs high, never low, until it
is taken again.
]]

local limit, n, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', keep, 'NX')
end
local count = tonumber(redis.call('GET', KEYS[1]))
if count == nil then
  return {2, 0}
end
if n > 0 and count + n > limit then
  return {1, math.max(1, redis.call('PTTL', KEYS[1]))}
end
return {0, redis.call('INCRBY', KEYS[1], n)}
