-- extend: ARGV 6 owner, 7 ttl ms (already checked <= MaxLeaseTTL by the client).
-- The lease becomes now + ttl.
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'LEASELOST', epoch, 'epoch'} end
local rec, why = load_record(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if not rec then return {'NOTFOUND', epoch} end
if rec.st == S_EXPIRED or rec.st == S_UNRESOLVED then return {'LEASELOST', epoch, 'state'} end
if rec.st ~= S_RESERVED and rec.st ~= S_DISPATCHED then return {'FINAL', epoch, rec.st} end
if rec.o ~= ARGV[6] then return {'LEASELOST', epoch, 'owner'} end
local ttl = cint(ARGV[7])
if ttl == nil or ttl <= 0 then return {'INVALID', epoch, 'ttl'} end
local le = now + ttl
rec.le = le
store(rec)
redis.call('ZADD', KEYS[2], le, ARGV[4])
touch(now)
return {'OK', epoch, le, rec.g}
