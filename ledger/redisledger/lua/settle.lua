-- settle: ARGV 6 actual csv, 7 source.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if not rec then return {'NOTFOUND', epoch} end
local scopes, serr = parse_spec(rec.sp)
if not scopes then
  if serr == 'keys' then return {'KEYS', epoch, rec.sp or ''} end
  return {'CORRUPT', epoch, serr}
end
local a = AMTS[ARGV[6]] or parse_amounts(ARGV[6])
if a == nil then return {'INVALID', epoch, 'actual'} end
if rec.st == S_SETTLED or rec.st == S_SETTLED_LATE then
  if rec.a_s == ARGV[6] then return {'REPLAY', epoch, rec.st, rec.ls or '', rec.h_s or '', rec.src or '', rec.g} end
  return {'CONFLICT', epoch}
end
if rec.st == S_CHARGED then return {'FINAL', epoch, rec.st} end
for i = 1, #scopes do local sc = scopes[i]
  if not load_scope(sc, rec.h) then return {'CORRUPT', epoch, 'scope'} end
end
local release = rec.st == S_RESERVED or rec.st == S_DISPATCHED or rec.st == S_UNRESOLVED
local slot = (rec.st == S_DISPATCHED or rec.st == S_RESERVED) and rec.sl == 1
if release and not check_release(scopes, rec.h, slot) then return {'CORRUPT', epoch, 'negative'} end
local plan = plan_charge(now, scopes, rec.wi, a)
if plan == nil then return {'CORRUPT', epoch, 'charge'} end
-- Overrun counters are read only where the actual passes the hold.
local f, over
if release then
  for j = 1, #a.nz do local d = a.nz[j]
    if a[d] > rec.h[d] then
      f = f or {}
      f[#f + 1] = OF[d]
    end
  end
end
if f then
  over = {}
  for i = 1, #scopes do local sc = scopes[i]
    local c = sload(sc.key, f)
    if not c then return {'CORRUPT', epoch, 'scope'} end
    for j = 1, #a.nz do local d = a.nz[j]
      local x = a[d] - rec.h[d]
      if x > 0 then
        if c[OF[d]] + x > MAXC then return {'CORRUPT', epoch, 'overrun'} end
        over[#over + 1] = {sc = sc, d = d, x = x}
      end
    end
  end
end
-- Apply.
local st = S_SETTLED
if release then
  do_release(scopes, rec.h, slot)
  if over then
    for i = 1, #over do local o = over[i]; sadd(o.sc.key, OF[o.d], o.x) end
  end
else
  st = S_SETTLED_LATE
end
do_charge(plan)
local prev = rec.st
rec.a_s, rec.src, rec.ls = ARGV[6], ARGV[7], prev
finalize(now, st, prev, rec)
touch(now)
return {'OK', epoch, st, prev, rec.h_s or '', rec.at or '0', now, rec.g}
