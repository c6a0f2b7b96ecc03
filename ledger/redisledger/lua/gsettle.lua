-- gsettle: a Settle of a record with a global hold and the hold's own
-- settle as one operation, on a standalone or Sentinel server (global.go,
-- settleCall). ARGV: 1 the hold "G.gid" the caller expects, then per record
-- (1 the tenant's, 2 the hold's) its number of keys, its number of
-- arguments and the arguments of that settle call; KEYS: both records'
-- keys. The hold's settle runs only when the tenant settle answered OK or
-- REPLAY naming that hold. Reply: {tenant reply} or {tenant reply, hold reply}.
local hold = ARGV[1]
local bind = bind_steps(2)
KEYS, ARGV = bind[1][1], bind[1][2]
local r = OPS.settle()
local g
if r[1] == 'OK' then g = r[8] elseif r[1] == 'REPLAY' then g = r[7] end
if g ~= hold then return {r} end
KEYS, ARGV = bind[2][1], bind[2][2]
return {r, OPS.settle()}
