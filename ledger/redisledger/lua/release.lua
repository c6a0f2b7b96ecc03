-- release: ARGV 6 owner. An unknown id gets a RELEASED tombstone.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if not rec then
  if #KEYS ~= 4 then return {'KEYS', epoch, ''} end
  -- (SET replaces an aged tombstone whole.)
  finalize(now, S_RELEASED, nil, {o = ARGV[6], h_s = '', ls = 0, g = ''})
  touch(now)
  return {'OK', epoch, 0, ''}
end
local scopes, serr = parse_spec(rec.sp)
if not scopes then
  if serr == 'keys' then return {'KEYS', epoch, rec.sp or ''} end
  return {'CORRUPT', epoch, serr}
end
if rec.st == S_RELEASED or rec.st == S_EXPIRED or rec.st == S_SETTLED_LATE then return {'OK', epoch, 1, rec.g} end
if rec.st ~= S_RESERVED then return {'DISPATCHED', epoch} end
if rec.o ~= ARGV[6] then return {'LEASELOST', epoch, 'owner'} end
for i = 1, #scopes do local sc = scopes[i]
  if not load_scope(sc, rec.h) then return {'CORRUPT', epoch, 'scope'} end
end
if not check_release(scopes, rec.h, false) then return {'CORRUPT', epoch, 'negative'} end
do_release(scopes, rec.h, false)
rec.ls = rec.st
finalize(now, S_RELEASED, rec.ls, rec)
touch(now)
return {'OK', epoch, 0, rec.g}
