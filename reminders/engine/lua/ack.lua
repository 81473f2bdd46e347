--[[ ack: jobs handled; drop them from prepare (phase two, success).

KEYS[1] prepare   KEYS[2] meta   KEYS[3] lease
ARGV[1] lease token   ARGV[2..] job ids
Returns: -1 when the lease no longer holds our token (nothing removed), else the number removed.
]]
-- @include common

if not fence_ok(KEYS[3], ARGV[1]) then return -1 end
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return 0 end
local removed = chunked('ZREM', KEYS[1], ids)
forget(KEYS[2], ids)
return removed
