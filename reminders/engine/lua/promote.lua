--[[ promote: move jobs that fall due by UNTIL from later into store, where claims look, keeping
their due times; at most LIMIT of them, earliest first.

KEYS[1] later   KEYS[2] store   KEYS[3] lease
ARGV[1] lease token   ARGV[2] until_ms   ARGV[3] limit
Returns: -1 when the lease no longer holds our token (nothing moved), else the number moved.
Why two sets: a claim removes what it takes from a sorted set, and removing from one that holds
ten million entries costs a cache miss or two more per entry than from one that holds what falls
due in the next minutes. The backlog waits in later; the slot's owner moves each job into store
a few minutes before it is due, at its own pace, so a burst is claimed from a small set.
]]
-- @include common

if not fence_ok(KEYS[3], ARGV[1]) then return -1 end
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
local n = #rows / 2
if n == 0 then return 0 end
local zargs = {}
for i = 1, n do
  zargs[2 * i - 1] = rows[2 * i]
  zargs[2 * i] = rows[2 * i - 1]
end
chunked('ZADD', KEYS[2], zargs)
-- The range started at -inf, so the rows are exactly ranks 0..n-1: one O(log N + n) removal.
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
return n
