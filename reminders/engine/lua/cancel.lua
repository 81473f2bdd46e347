--[[ cancel: remove one job from wherever it is in its slot.

KEYS[1] store   KEYS[2] prepare   KEYS[3] dead   KEYS[4] meta   KEYS[5] later
ARGV[1] job_id
Returns: 1 found scheduled (store or later), 2 found in prepare (in flight), 3 found in dead,
0 not found (a job inside a parcel is not found: see claim_parcel).
]]
-- @include common

local id = ARGV[1]
local where = 0
if redis.call('ZREM', KEYS[1], id) == 1 then where = 1 end
if redis.call('ZREM', KEYS[5], id) == 1 then where = 1 end
if redis.call('ZREM', KEYS[2], id) == 1 and where == 0 then where = 2 end
if redis.call('ZREM', KEYS[3], id) == 1 and where == 0 then where = 3 end
forget(KEYS[4], {id})
return where
