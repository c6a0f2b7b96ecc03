-- resolve: UNRESOLVED -> CHARGED at the held amount. ARGV 6: "1" admin
-- (unconditional), "0" Reclaim (only once the first admission window closed).
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if not rec then
  if redis.call('ZSCORE', KEYS[3], ARGV[4]) then return {'CORRUPT', epoch, 'entry without record'} end
  return {'NOTFOUND', epoch}
end
local scopes, serr = parse_spec(rec.sp)
if not scopes then
  if serr == 'keys' then return {'KEYS', epoch, rec.sp or ''} end
  return {'CORRUPT', epoch, serr}
end
if rec.st == S_CHARGED then return {'REPLAY', epoch, rec.h_s or '', rec.g} end
if rec.st ~= S_UNRESOLVED then
  if not is_open(rec.st) then return {'FINAL', epoch, rec.st} end
  return {'NOTDUE', epoch, rec.st}
end
if ARGV[6] ~= '1' and now < rec.ra then return {'NOTDUE', epoch, rec.st} end
for i = 1, #scopes do local sc = scopes[i]
  if not load_scope(sc, rec.h) then return {'CORRUPT', epoch, 'scope'} end
end
if not check_release(scopes, rec.h, false) then return {'CORRUPT', epoch, 'negative'} end
local plan = plan_charge(now, scopes, rec.wi, rec.h)
if plan == nil then return {'CORRUPT', epoch, 'charge'} end
do_release(scopes, rec.h, false)
do_charge(plan)
rec.a_s, rec.src, rec.ls = rec.h_s or '', 'held', rec.st
finalize(now, S_CHARGED, rec.ls, rec)
touch(now)
return {'OK', epoch, rec.h_s or '', rec.at or '0', now, rec.g}
