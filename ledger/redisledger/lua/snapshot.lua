-- snapshot (read-only): KEYS 1 meta, 2 U, 3 scope hash.
-- Returns {'OK', now, pv, #U, flat HGETALL of the scope}.
local now = ledger_now()
if not now then return {'CORRUPT'} end
local pv = redis.call('HGET', KEYS[1], 'pv') or '0'
return {'OK', now, pv, redis.call('ZCARD', KEYS[2]), redis.call('HGETALL', KEYS[3])}
