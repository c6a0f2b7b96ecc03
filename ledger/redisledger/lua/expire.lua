-- expire (Reclaim of one due lease): RESERVED -> EXPIRED, DISPATCHED -> UNRESOLVED.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if not rec then
  -- A lease entry without a record is corruption (I7); a stale entry of a
  -- record that was already resolved is not (it is removed when finalized).
  if redis.call('ZSCORE', KEYS[2], ARGV[4]) then return {'CORRUPT', epoch, 'lease without record'} end
  return {'NOTDUE', epoch}
end
local scopes, serr = parse_spec(rec.sp)
if not scopes then
  if serr == 'keys' then return {'KEYS', epoch, rec.sp or ''} end
  return {'CORRUPT', epoch, serr}
end
if (rec.st ~= S_RESERVED and rec.st ~= S_DISPATCHED) or now < rec.le then return {'NOTDUE', epoch} end
for i = 1, #scopes do local sc = scopes[i]
  if not load_scope(sc, rec.h) then return {'CORRUPT', epoch, 'scope'} end
end
if rec.st == S_RESERVED then
  if not check_release(scopes, rec.h, false) then return {'CORRUPT', epoch, 'negative'} end
  do_release(scopes, rec.h, false)
  rec.ls = rec.st
  finalize(now, S_EXPIRED, rec.st, rec)
  touch(now)
  return {'OK', epoch, S_EXPIRED, 0, 0, rec.g}
end
-- DISPATCHED: free the slot only; consumable holds stay.
local slot = rec.sl == 1
for i = 1, #scopes do local sc = scopes[i]
  if slot and sc.slot and sc.n < 1 then return {'CORRUPT', epoch, 'negative'} end
end
if slot then
  for i = 1, #scopes do local sc = scopes[i]
    if sc.slot then sadd(sc.key, 'n', -1) end
  end
end
local ra = resolve_at(rec.wi)
rec.st, rec.sl, rec.ra = S_UNRESOLVED, 0, ra
store(rec)
redis.call('ZREM', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], ra, ARGV[4])
touch(now)
return {'OK', epoch, S_UNRESOLVED, ra, now, rec.g}
