--[[ bench_pop: the machine's raw limit for the benchmarks, a bare pop-and-ack (no prepare,
no fencing, no attempts): remove and return up to LIMIT due members of one sorted set.

KEYS[1] sorted set
ARGV[1] now_ms   ARGV[2] limit
Returns: the members removed.
]]

local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #ids, 4000 do
  redis.call('ZREM', KEYS[1], unpack(ids, i, math.min(i + 3999, #ids)))
end
return ids
