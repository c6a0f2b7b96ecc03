-- scans (read-only, the library only): scan for several partitions in one
-- call, Run's idle pass. KEYS: the first partition's meta, L, U. ARGV 1 max,
-- 2 m (how many other partitions), then their keys, three each. Returns
-- {'OK', entry...} with an entry per partition i (1-based, in order) that
-- has a due id, {i, now, {L ids}, {U ids}} as scan returns them, or that
-- could not be read here, {i, 'CORRUPT'} or {i, 'ERR', message}; an idle
-- partition (no open record: L and U do not exist) has none, and costs one
-- EXISTS (its meta is not read). On a Cluster the function may touch undeclared keys
-- (allow-cross-slot-keys); a read of a slot this node does not serve whole
-- raises, which is that partition's ERR, and the client scans it alone
-- through its slot. Nothing here writes, so a partition stopped halfway
-- left nothing behind.
local K0, A0 = KEYS, ARGV
local n, m = tonumber(A0[1]), tonumber(A0[2])
local out = {'OK'}
local function one()
  -- An empty sorted set does not exist: an idle partition costs one call.
  if redis.call('EXISTS', KEYS[2], KEYS[3]) == 0 then return 0 end
  local now = ledger_now()
  if not now then return false end
  local l = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, n)
  local u = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, n)
  return now, l, u
end
for i = 0, m do
  if i > 0 then KEYS = {A0[3 * i], A0[3 * i + 1], A0[3 * i + 2]} end
  local ok, now, l, u = pcall(one)
  if not ok then
    if type(now) == 'table' then now = now.err end
    out[#out + 1] = {i + 1, 'ERR', tostring(now)}
  elseif not now then
    out[#out + 1] = {i + 1, 'CORRUPT'}
  elseif now ~= 0 and (#l > 0 or #u > 0) then
    out[#out + 1] = {i + 1, now, l, u}
  end
end
KEYS = K0
return out
