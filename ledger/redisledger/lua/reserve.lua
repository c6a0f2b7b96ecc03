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
local now = ledger_now()
if not now then return {'CORRUPT', '', 'hwm'} end
local epoch, fenced = epoch_check(now)
if fenced then return {'RECOVERING', epoch} end

local h = parse_amounts(ARGV[11])
if h == nil then return {'INVALID', epoch, 'held'} end
local scopes, serr = parse_spec(ARGV[12])
if not scopes then return {'POLICY', epoch, serr} end

-- Idempotency first: an existing record answers the call.
local rec, why = record_or_none(now)
if rec == nil then return {'CORRUPT', epoch, why} end
if rec then
  if not is_open(rec.st) then return {'FINAL', epoch, rec.st} end
  if rec.dg ~= ARGV[8] then return {'CONFLICT', epoch} end
  local a, aerr = assess(now, scopes, ZA(), false, epoch)
  if not a then return {'CORRUPT', epoch, aerr} end
  local same = 0
  if ARGV[15] ~= '0' and rec.na == ARGV[15] then same = 1 end
  return append_room({'REPLAY', epoch, rec.o, rec.le, rec.st, now, rec.g, same}, a)
end
if ARGV[14] == '1' then return {'NOREC', epoch} end

local fence = cint(META.fence_s)
if fence == nil then return {'CORRUPT', epoch, 'meta'} end
if now < fence then return {'RECOVERING', epoch} end
-- The policy version is recorded for audit only, never compared: limits
-- travel with every Reserve (ledger/doc.go, "Policy versions").
local cpv = cint(ARGV[6])
if cpv == nil then return {'POLICY', epoch, 'version'} end
local dispatch = ARGV[10] == '1'
local ttl = cint(ARGV[9])
if ttl == nil or ttl <= 0 then return {'INVALID', epoch, 'ttl'} end

-- Validate every counter and decide admission before any write.
local a, aerr = assess(now, scopes, h, dispatch, epoch)
if not a then return {'CORRUPT', epoch, aerr} end
if a.deny then return a.deny end
if a.dslot then return a.dslot end
if ARGV[14] == '2' then return {'CHECKED', epoch} end

-- Apply (scope writes go to the call's cache, flushed once at the end).
local le = now + ttl
local sl = 0
for _, sc in ipairs(scopes) do
  local key = sc.key
  for _, l in ipairs(sc.lims) do
    if l.widx < l.idx then
      sput(key, l.wf, l.idx)
      sput(key, l.cf, 0)
    end
  end
  for _, d in ipairs(sc.dlist) do
    local x = h[d]
    if x > 0 then sadd(key, RF[d], x) end
  end
  if dispatch and sc.slot then
    sadd(key, 'n', 1)
    sl = 1
  end
  if sc.seen ~= sc.spec then sput(key, 'lim', sc.spec) end
end
local wins = scopes.wins
local wi = {}
for i = 1, #wins do wi[i] = wins[i].k .. window_of(now, wins[i].w) end
local st = S_RESERVED
if dispatch then st = S_DISPATCHED end
if why == 'aged' then redis.call('DEL', KEYS[4]) end
local les, nows = fmt('%d', le), fmt('%d', now)
local rf = {'st', SS[st], 'o', ARGV[7], 'dg', ARGV[8], 'le', les, 'h', ARGV[11],
  'sp', ARGV[12], 'wi', table.concat(wi, ','), 'sl', sl == 1 and '1' or '0', 'at', nows}
if ARGV[13] ~= '' then rf[#rf + 1], rf[#rf + 2] = 'g', ARGV[13] end
if ARGV[15] ~= '0' then rf[#rf + 1], rf[#rf + 2] = 'na', ARGV[15] end
redis.call('HSET', KEYS[4], unpack(rf))
redis.call('ZADD', KEYS[2], les, ARGV[4])
if META.pv_s ~= ARGV[6] then
  touch(now, ARGV[6])
else
  touch(now)
end
return append_room({'OK', epoch, le, now}, a)
