-- greserve: a Reserve with a global scope on a standalone or Sentinel server
-- (global.go, reserveAtomic): the tenant check, the global hold and the
-- tenant reserve as one operation, each step only when the one before
-- admitted (CHECKED, then OK). ARGV: per step its number of keys, its number
-- of arguments and the arguments of that reserve call; KEYS: every step's
-- keys in order. Reply: the steps' replies, in order, up to the first that
-- did not admit.
local K, A = KEYS, ARGV
local out = {}
local ki, ai = 1, 1
for step = 1, 3 do
  local nk, na = tonumber(A[ai]), tonumber(A[ai + 1])
  ai = ai + 2
  KEYS = {unpack(K, ki, ki + nk - 1)}
  ARGV = {unpack(A, ai, ai + na - 1)}
  ki, ai = ki + nk, ai + na
  local r = OPS.reserve()
  out[step] = r
  if (step == 1 and r[1] ~= 'CHECKED') or (step == 2 and r[1] ~= 'OK') then break end
end
return out
