-- records (read-only, List, and Reclaim's look at a global hold's request):
-- KEYS are record keys. Reply: per key {state, owner, lease expiry, held
-- csv, admitted at, actual csv, source, g}, or {0} where there
-- is no record or it does not decode (List skips those, as it skips an id
-- whose record changed state since the index was read).
local out = {}
for i = 1, #KEYS do
  local ok, r = pcall(read_record, KEYS[i])
  if ok and r then
    out[i] = {r.st, r.o or '', r.le or '', r.h_s or '', r.at or '', r.a_s or '', r.src or '', r.g or ''}
  else
    out[i] = {0}
  end
end
return out
