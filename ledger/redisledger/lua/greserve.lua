-- greserve: a Reserve with a global scope on a standalone or Sentinel server
-- (global.go, reserveAtomic), as one operation: it plans the tenant step
-- (every refusal and replay answers as the stepwise check would), then the
-- global hold, and writes both only when both admit. ARGV: per step (1 the
-- global hold, 2 the tenant step) its number of keys, its number of
-- arguments and the arguments of that reserve call; KEYS: both steps' keys.
-- Reply: the replies of the stepwise protocol, up to the first refusal:
-- {tenant reply} or {CHECKED, global reply} or {CHECKED, global OK, tenant OK}.
local bind = bind_steps(1)
KEYS, ARGV = bind[2][1], bind[2][2]
local pt, rt = reserve_plan()
if not pt then return {rt} end
local checked = {'CHECKED', pt.epoch}
KEYS, ARGV = bind[1][1], bind[1][2]
local pg, rg = reserve_plan()
if not pg then return {checked, rg} end
return {checked, reserve_apply(pg), reserve_apply(pt)}
