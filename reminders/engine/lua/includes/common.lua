-- Shared fragment, pasted in by scripts.py where a script says "-- @include common".
-- Lua numbers are doubles and redis.call() formats them with "%.14g", which would round a prepare
-- score (16 digits); every score handed to Redis goes through fmt() instead.
local function fmt(n)
  return string.format('%.0f', n)
end

-- unpack() is limited by the Lua C stack (~8000 values): call `cmd key args...` in chunks.
local function chunked(cmd, key, args)
  local total = 0
  for i = 1, #args, 4000 do
    total = total + redis.call(cmd, key, unpack(args, i, math.min(i + 3999, #args)))
  end
  return total
end

-- The fencing check: the slot's lease key must still hold exactly our token. The token
-- 'handed-on' settles entries a lease holder handed on to a deliverer (invariant 6); real tokens
-- are "<fence>:<worker id>" and can never equal it.
local function fence_ok(lease_key, token)
  if token == 'handed-on' then return true end
  return token ~= '' and redis.call('GET', lease_key) == token
end

-- Attempts recorded in the meta hash for `ids` (0 when none), and which of them are suspects
-- (the reaper brought them back: their handler never answered, so it may be what killed its
-- worker). One HMGET per chunk, none at all when the slot has no meta (the common case).
local function attempts_of(meta_key, ids)
  local out, suspect = {}, {}
  if redis.call('EXISTS', meta_key) == 0 then
    for i = 1, #ids do out[i] = 0 end
    return out, suspect
  end
  for i = 1, #ids, 2000 do
    local fields = {}
    local last = math.min(i + 1999, #ids)
    for j = i, last do
      fields[#fields + 1] = 'a:' .. ids[j]
      fields[#fields + 1] = 's:' .. ids[j]
    end
    local got = redis.call('HMGET', meta_key, unpack(fields))
    for j = i, last do
      local at = 2 * (j - i) + 1
      out[j] = tonumber(got[at]) or 0
      if got[at + 1] then suspect[j] = true end
    end
  end
  return out, suspect
end

local function forget(meta_key, ids)
  if #ids == 0 or redis.call('EXISTS', meta_key) == 0 then return end
  local fields = {}
  for i = 1, #ids do
    fields[#fields + 1] = 'a:' .. ids[i]
    fields[#fields + 1] = 'e:' .. ids[i]
    fields[#fields + 1] = 's:' .. ids[i]
  end
  chunked('HDEL', meta_key, fields)
end
