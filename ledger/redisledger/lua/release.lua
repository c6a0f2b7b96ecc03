-- release: ARGV 6 owner. An unknown id gets a RELEASED tombstone.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if not rec then
  if #KEYS ~= 4 then return {'KEYS', epoch, ''} end
  redis.call('DEL', KEYS[4])
  finalize(now, S_RELEASED, nil, 'o', ARGV[6], 'h', '', 'ls', 0)
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
for _, sc in ipairs(scopes) do
  if not load_scope(sc) then return {'CORRUPT', epoch, 'scope'} end
end
if not check_release(scopes, rec.h, false) then return {'CORRUPT', epoch, 'negative'} end
do_release(scopes, rec.h, false)
finalize(now, S_RELEASED, rec.st, 'ls', rec.st)
touch(now)
return {'OK', epoch, 0, rec.g}
