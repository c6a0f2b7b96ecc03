-- extend: ARGV 6 owner, 7 ttl ms (already checked <= MaxLeaseTTL by the client).
-- The lease becomes now + ttl.
local refused, now, epoch, rec = open_lease()
if refused then return refused end
local ttl = cint(ARGV[7])
if ttl == nil or ttl <= 0 then return {'INVALID', epoch, 'ttl'} end
local le = now + ttl
rec.le = le
store(rec)
redis.call('ZADD', KEYS[2], le, ARGV[4])
touch(now)
return {'OK', epoch, le, rec.g}
