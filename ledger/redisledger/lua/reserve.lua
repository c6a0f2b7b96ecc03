-- reserve: ARGV 6 policy version, 7 owner, 8 digest, 9 lease ttl ms,
-- 10 dispatch (0|1), 11 held csv, 12 spec, 13 global hold ('' none: the
-- global partition and id of the request's global hold, see global.go),
-- 14 mode: '0' reserve; '1' replay only (answer from an existing record,
-- else NOREC, writing nothing; used after a global denial, so a replay
-- still replays); '2' check only (answer as a reserve would, but CHECKED
-- instead of admitting, writing nothing; used before a global hold).
-- 15 attempt nonce ('0' none), stored as field na.
-- OK:     {'OK', epoch, leaseExpiry, now, room...}
-- REPLAY: {'REPLAY', epoch, owner, leaseExpiry, state, now, global hold, same attempt (0|1), room...}
-- where room is append_room's layout (headroom after the call).
local p, r = reserve_plan()
if not p then return r end
return reserve_apply(p)
