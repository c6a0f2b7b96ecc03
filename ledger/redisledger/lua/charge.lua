-- charge (Charge: usage admitted while the ledger was unreachable): ARGV 6
-- amounts csv, 7 spec, 8 usage time ms (At), 9 digest.
-- OK:     {'OK', epoch, now, at, overLimit (0|1)}
-- REPLAY: {'REPLAY', epoch, amounts csv}
-- Never denied. The record is a SETTLED tombstone (src outage, no hold)
-- admitted at At, charged to every limit of its spec whose current window
-- contains At.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end
local a = parse_amounts(ARGV[6])
if a == nil then return {'INVALID', epoch, 'amounts'} end
local scopes, serr = parse_spec(ARGV[7])
if not scopes then return {'POLICY', epoch, serr} end
local rec, why = record_or_none(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if rec then
  if rec.src ~= 'outage' or rec.st ~= S_SETTLED then return {'CONFLICT', epoch} end
  if rec.dg ~= ARGV[9] then return {'CONFLICT', epoch} end
  return {'REPLAY', epoch, rec.a_s or ''}
end
local at = cint(ARGV[8])
if at == nil then return {'INVALID', epoch, 'at'} end
if at > now then at = now end
-- Validate every counter before any write.
local plan = {}
for i = 1, #scopes do local sc = scopes[i]
  if not load_scope(sc, Z0) then return {'CORRUPT', epoch, 'scope'} end
  for j = 1, #sc.lims do local l = sc.lims[j]
    local idx = window_of(now, l.w)
    if l.widx > idx then return {'CORRUPT', epoch, 'window'} end
    l.idx = idx
    l.cur = l.c
    if l.widx < idx then l.cur = 0 end
    local amt = a[l.d] or 0
    if window_of(at, l.w) == idx and amt > 0 then
      if l.cur + amt > MAXC then return {'CORRUPT', epoch, 'charge'} end
      table.insert(plan, {sc = sc, l = l, amt = amt})
    end
  end
end
-- Apply.
for i = 1, #scopes do local sc = scopes[i]
  for j = 1, #sc.lims do local l = sc.lims[j]
    if l.widx < l.idx then
      sput(sc.key, l.wf, l.idx)
      sput(sc.key, l.cf, 0)
    end
  end
  if not sc.seen then sput(sc.key, 'lim', sc.spec) end
end
for i = 1, #plan do local p = plan[i]
  sadd(p.sc.key, p.l.cf, p.amt)
  p.l.cur = p.l.cur + p.amt
end
local over = 0
for i = 1, #scopes do local sc = scopes[i]
  for j = 1, #sc.lims do local l = sc.lims[j]
    if l.cur + sc.r[l.d] > l.max then over = 1 end
  end
end
local wi = {}
local seen = {}
for i = 1, #scopes do local sc = scopes[i]
  for j = 1, #sc.lims do local l = sc.lims[j]
    if not seen[l.w] then
      seen[l.w] = true
      table.insert(wi, l.w .. ':' .. window_of(at, l.w))
    end
  end
end
table.sort(wi)
-- (SET replaces an aged tombstone whole.)
finalize(now, S_SETTLED, nil, {o = '', dg = ARGV[9], le = now, h_s = '', a_s = ARGV[6], src = 'outage',
  sp = ARGV[7], wi_s = table.concat(wi, ','), sl = 0, at = at, ls = 0, g = ''})
touch(now)
return {'OK', epoch, now, at, over}
