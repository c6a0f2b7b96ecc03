-- grow (Grow): ARGV 6 owner, 7 the hold it grows from (csv), 8 the hold it
-- grows to (csv). Admitted like a Reserve of the difference against every
-- block-mode limit of the record's scopes (as its spec names them); a
-- record already holding 8 answers OK (a retry), one holding neither 7 nor
-- 8 CONFLICT.
-- OK: {'OK', epoch, replayed (0|1), global hold}; DENIED as reserve's.
local refused, now, epoch, rec = open_lease()
if refused then return refused end
local from = AMTS[ARGV[7]] or parse_amounts(ARGV[7])
local to = AMTS[ARGV[8]] or parse_amounts(ARGV[8])
if from == nil or to == nil then return {'INVALID', epoch, 'held'} end
local function same(x, y)
  for i = 1, #WD do local d = WD[i]
    if x[d] ~= y[d] then return false end
  end
  return true
end
if same(rec.h, to) then return {'OK', epoch, 1, rec.g} end
if not same(rec.h, from) then return {'CONFLICT', epoch} end
local scopes, serr = parse_spec(rec.sp)
if not scopes then
  if serr == 'keys' then return {'KEYS', epoch, rec.sp or ''} end
  return {'CORRUPT', epoch, serr}
end
local parts = {}
for d = 0, NDIMS - 1 do
  local x = to[d] - from[d]
  if x < 0 then
    if d ~= SLOTS then return {'INVALID', epoch, 'shrink'} end
    x = 0
  end
  parts[d + 1] = fmtd(x)
end
local add = parse_amounts(table.concat(parts, ','))
if add == nil then return {'INVALID', epoch, 'held'} end
local a, aerr = assess(now, scopes, add, false, epoch)
if not a then return {'CORRUPT', epoch, aerr} end
if a.deny then return a.deny end
for i = 1, #scopes do local sc = scopes[i]
  local key, c, sd, dl = sc.key, sc.c, sc.d, sc.dlist
  for j = 1, #dl do local d = dl[j]
    local x = add[d]
    if x > 0 then
      local f = RF[d]
      c[f] = c[f] + x
      if sd[f] ~= GEN then dirty(key, sd, f) end
    end
  end
end
rec.h_s, rec.h = ARGV[8], to
store(rec)
touch(now)
return {'OK', epoch, 0, rec.g}
