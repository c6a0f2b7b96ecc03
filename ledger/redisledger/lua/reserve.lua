-- reserve: ARGV 6 policy version, 7 owner, 8 digest, 9 lease ttl ms,
-- 10 dispatch (0|1), 11 held csv, 12 spec.
-- Reply OK: {'OK', epoch, leaseExpiry, now, 7 x (tracked, max, remaining, W, resetsAt), nwarn, nwarn x (scope, d, W, max, used, resetsAt)}.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end

-- Idempotency first: an existing record answers the call.
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if rec then
  if not is_open(rec.st) then return {'FINAL', epoch, rec.st} end
  if rec.dg ~= ARGV[8] then return {'CONFLICT', epoch} end
  return {'REPLAY', epoch, rec.o, rec.le, rec.st, now}
end

local fu = redis.call('HMGET', KEYS[1], 'fence_until', 'pv')
local fence, pv = cint(fu[1]), cint(fu[2])
if fence == nil or pv == nil then return {'CORRUPT', epoch, 'meta'} end
if now < fence then return {'RECOVERING', epoch} end
local cpv = cint(ARGV[6])
if cpv == nil then return {'POLICY', epoch, 'version'} end
if cpv < pv then return {'POLICY', epoch, 'stale policy version'} end

local h = parse_amounts(ARGV[11])
if h == nil then return {'INVALID', epoch, 'held'} end
local scopes, serr = parse_spec(ARGV[12])
if not scopes then return {'POLICY', epoch, serr} end
local dispatch = ARGV[10] == '1'
local ttl = cint(ARGV[9])
if ttl == nil or ttl <= 0 then return {'INVALID', epoch, 'ttl'} end

-- Validate every counter and decide admission before any write.
local deny, dslot = nil, nil
local room = {}
local warns = {}
local widx = {}
local function note(d, max, rem, w, resets)
  if rem < 0 then rem = 0 end
  local r = room[d]
  if r == nil or rem < r[3] or (rem == r[3] and resets > r[5]) then room[d] = {1, max, rem, w, resets} end
end
for si, sc in ipairs(scopes) do
  if not load_scope(sc) then return {'CORRUPT', epoch, 'scope'} end
  for _, d in ipairs(sc.dlist) do
    if sc.r[d] + (h[d] or 0) > MAXC then return {'CORRUPT', epoch, 'overflow'} end
  end
  for _, l in ipairs(sc.lims) do
    local idx = window_of(now, l.w)
    if l.widx > idx then return {'CORRUPT', epoch, 'window'} end
    widx[l.w] = idx
    l.cur = l.c
    if l.widx < idx then l.cur = 0 end
    local hd = h[l.d] or 0
    local resets = (idx + 1) * l.w * 1000
    local used = l.cur + sc.r[l.d] + hd
    if l.mode == 'b' then
      if used > l.max then
        if deny == nil or resets > deny[10] then
          deny = {'DENIED', epoch, si, l.d, l.w, l.max, l.cur, sc.r[l.d], hd, resets, now}
        end
      else
        note(l.d, l.max, l.max - used, l.w, resets)
      end
    elseif used > l.max then
      table.insert(warns, {si, l.d, l.w, l.max, used, resets})
    end
  end
  if sc.slot then
    local used = sc.n
    if dispatch then used = used + 1 end
    if sc.slot.mode == 'b' then
      if used > sc.slot.max then
        if dslot == nil then dslot = {'DENIED', epoch, si, sc.slot.d, 0, sc.slot.max, 0, sc.n, 1, 0, now} end
      else
        note(sc.slot.d, sc.slot.max, sc.slot.max - used, 0, 0)
      end
    elseif used > sc.slot.max then
      table.insert(warns, {si, sc.slot.d, 0, sc.slot.max, used, 0})
    end
  end
end
if deny then return deny end
if dslot then return dslot end

-- Apply.
local le = now + ttl
local sl = 0
for _, sc in ipairs(scopes) do
  for _, l in ipairs(sc.lims) do
    local idx = widx[l.w]
    if l.widx < idx then
      redis.call('HSET', sc.key, 'w:' .. l.d .. ':' .. l.w, idx, 'c:' .. l.d .. ':' .. l.w, 0)
    end
  end
  for _, d in ipairs(sc.dlist) do
    if (h[d] or 0) > 0 then redis.call('HINCRBY', sc.key, 'r:' .. d, h[d]) end
  end
  if dispatch and sc.slot then
    redis.call('HINCRBY', sc.key, 'n', 1)
    sl = 1
  end
  if sc.seen ~= sc.spec then redis.call('HSET', sc.key, 'lim', sc.spec) end
end
local wi = {}
for w, idx in pairs(widx) do table.insert(wi, w .. ':' .. idx) end
table.sort(wi)
local st = S_RESERVED
if dispatch then st = S_DISPATCHED end
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[4], 'st', st, 'o', ARGV[7], 'dg', ARGV[8], 'le', le, 'h', ARGV[11],
  'sp', ARGV[12], 'wi', table.concat(wi, ','), 'sl', sl, 'at', now)
redis.call('ZADD', KEYS[2], le, ARGV[4])
if cpv > pv then
  redis.call('HSET', KEYS[1], 'hwm', now, 'pv', cpv)
else
  touch(now)
end
local out = {'OK', epoch, le, now}
for d = 0, h.n - 1 do
  local r = room[d] or {0, 0, 0, 0, 0}
  for i = 1, 5 do table.insert(out, r[i]) end
end
table.insert(out, #warns)
for _, w in ipairs(warns) do
  for i = 1, 6 do table.insert(out, w[i]) end
end
return out
