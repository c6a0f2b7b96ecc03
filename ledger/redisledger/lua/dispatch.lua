-- dispatch (MarkDispatched): ARGV 6 owner.
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
if rec.st == S_DISPATCHED then
  if rec.o ~= ARGV[6] then return {'LEASELOST', epoch, 'owner'} end
  return {'OK', epoch, rec.le, 1, rec.g}
end
if rec.st == S_EXPIRED or rec.st == S_UNRESOLVED then return {'LEASELOST', epoch, 'state'} end
if rec.st ~= S_RESERVED then return {'FINAL', epoch, rec.st} end
if rec.o ~= ARGV[6] then return {'LEASELOST', epoch, 'owner'} end
local any = false
for si = 1, #scopes do local sc = scopes[si]
  if not load_scope(sc, Z0) then return {'CORRUPT', epoch, 'scope'} end
  if sc.slot then
    any = true
    if sc.slot.mode == 'b' and sc.n + 1 > sc.slot.max then
      return {'DENIED', epoch, si, sc.slot.d, 0, sc.slot.max, 0, sc.n, 1, 0, now}
    end
  end
end
local sl = 0
if any then
  sl = 1
  for i = 1, #scopes do local sc = scopes[i]
    if sc.slot then sadd(sc.key, 'n', 1) end
  end
end
rec.st, rec.sl = S_DISPATCHED, sl
store(rec)
touch(now)
return {'OK', epoch, rec.le, 0, rec.g}
