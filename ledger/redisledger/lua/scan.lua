-- scan (read-only): due leases and chargeable UNRESOLVED ids of one tenant.
-- KEYS 1 meta, 2 L, 3 U. ARGV 1 max. Returns {'OK', now, {L ids}, {U ids}}.
local now = ledger_now()
if not now then return {'CORRUPT'} end
local n = tonumber(ARGV[1])
local l = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, n)
local u = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, n)
return {'OK', now, l, u}
