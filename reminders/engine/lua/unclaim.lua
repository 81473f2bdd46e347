--[[ unclaim: give claimed jobs back to store, due when they were, as if never claimed (a worker
that held them ahead of their due time stops before it fired them).

KEYS[1] prepare   KEYS[2] store
ARGV[1], ARGV[2], ARGV[3]: job_id, due_ms, attempt of a claim to give back; and so on, in threes
Returns: how many were given back. A job is given back only while prepare holds it on the same
attempt (prepare score = deadline * 1000 + attempt): one acked, reaped or claimed again since is
left alone. Its attempt is not spent (the claim recorded none in meta), it is not a suspect, and
a schedule made since (a reschedule put it in store again) is kept.
]]
-- @include common

local given = 0
for i = 1, #ARGV, 3 do
  local id, due, attempt = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) % 1000 == attempt then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], 'NX', due, id)
    given = given + 1
  end
end
return given
