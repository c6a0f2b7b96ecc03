-- Shared prelude of every Sluice ledger script (concatenated after the
-- shebang line by scripts.go). KEYS: 1 meta (m), 2 lease zset (L),
-- 3 unresolved zset (U), 4 record (q:<id>), 5.. scope hashes in spec order.
-- Common ARGV: 1 cached epoch ("" = none), 2 candidate epoch, 3 MaxLeaseTTL ms,
-- 4 request id, 5 tombstone retention ms. Replies are arrays whose first
-- element is a status word; scripts never raise errors on purpose, and every
-- check happens before the first write (Redis scripts have no rollback).
-- NDIMS and SLOTS (ledger.NumDims and ledger.Slots) are defined by the line
-- scripts.go puts before this prelude, so no script hardcodes the dimensions.
-- WD lists the windowed dimensions (every one but SLOTS), RF and OF their
-- r:<d> and o:<d> field names.
local WD, RF, OF = {}, {}, {}
for d = 0, NDIMS - 1 do
  if d ~= SLOTS then
    WD[#WD + 1] = d
    RF[d], OF[d] = 'r:' .. d, 'o:' .. d
  end
end
local MAXC = 9007199254740991 -- 2^53-1, the largest counter
local MAXA = 1125899906842624 -- 2^50, the largest amount or limit
-- States, numbered like ledger.State.
local S_RESERVED, S_DISPATCHED, S_SETTLED, S_RELEASED = 1, 2, 3, 4
local S_EXPIRED, S_UNRESOLVED, S_CHARGED, S_SETTLED_LATE = 5, 6, 7, 8
local function is_open(st) return st == S_RESERVED or st == S_DISPATCHED or st == S_UNRESOLVED end

local find, gmatch, match, sub, byte = string.find, string.gmatch, string.match, string.sub, string.byte
local fmt, rcall, tinsert = string.format, redis.call, table.insert

-- cint parses a stored counter: missing is 0, anything but 0..2^53-1 written
-- canonically (no sign, no leading zero, as HINCRBY writes and requires) is
-- nil (corrupt), so no later write can fail half-way through a script.
-- v + 0 converts once; tonumber(v) runs strtod twice (lua_isnumber, then
-- lua_tonumber), and strtod was ~5 % of redis-server's instructions.
-- CI remembers the texts cint accepted (a pure function of the text):
-- window indexes, slot counts and many holds recur call after call, and
-- the check costs a pattern match and a strtod. Bounded: it starts over
-- after 256 texts (CMAX). A larger memo measured slower (4,096 entries:
-- 1.8 % more instructions per pair than 256; 64 as few as 256): changing
-- counters fill it with texts that never recur, kept alive for the GC.
local CMAX = 256
local CI, NCI = {}, 0
local function cint(v)
  if not v then return 0 end
  local n = CI[v]
  if n then return n end
  if v == '0' then return 0 end
  if #v > 16 or not find(v, '^[1-9]%d*$') then return nil end
  n = v + 0
  if n > MAXC then return nil end
  if NCI >= CMAX then CI, NCI = {}, 0 end
  CI[v], NCI = n, NCI + 1
  return n
end

-- fmtd formats an integer for a write, remembering up to CMAX (every
-- format is a printf; the same counters recur, and one call's leases and
-- hwm repeat one value).
local FT, NFT = {}, 0
local function fmtd(n)
  local s = FT[n]
  if s then return s end
  s = fmt('%d', n)
  if NFT >= CMAX then FT, NFT = {}, 0 end
  FT[n], NFT = s, NFT + 1
  return s
end

-- The last ARGV of every script is a clock floor in ms: 0 in production; the
-- conformance tests pin ledger time with it (set by begin).
local FLOOR = 0

-- META holds the tenant meta hash fields read once by ledger_now.
local META = {}
-- GEN numbers the calls (begin): a cache entry stamped with another
-- call's number is stale.
local GEN = 0
-- One script call is one instant: TIME is read once (TNOW, ms), and each
-- meta hash once (MC[k]: {hwm, epoch, fence_until, pv} as read or as
-- written since, valid while MG[k] is this call). hwm and pv are written
-- back once per meta key by flush, at the end of the call (a batch of
-- operations on one tenant writes its hwm once): MDL[1..MDN] lists the
-- keys touched (MD[k]: the call that listed k; MDP[k]: the call that set
-- pv). The tables outlive the call, stamped, so a call builds none (begin
-- bounds them).
local TNOW
local MC, MG, MD, MDP, NMC = {}, {}, {}, {}, 0
local MDL, MDN = {}, 0

-- m[1], hwm, is kept as a number (false: none; nil: corrupt). k is a
-- meta key, the operation's tenant's (KEYS[1]) by default.
local function meta(k)
  k = k or KEYS[1]
  local m = MC[k]
  if not m or MG[k] ~= GEN then
    m = rcall('HMGET', k, 'hwm', 'epoch', 'fence_until', 'pv')
    if m[1] then m[1] = cint(m[1]) end
    if not MG[k] then NMC = NMC + 1 end
    MC[k], MG[k] = m, GEN
  end
  return m
end

-- XK is the operation's second meta key, or nil: a record with a global
-- scope kept inline (global.go) names that scope's hash in the global
-- partition and, as its last key, the global partition's meta "...:m" (no
-- scope key ends so: they end in base64url). The operation's ledger time is
-- then the later of both partitions' (every tenant charges the one global
-- hash, so its windows follow one clock that never goes back), and touch
-- raises both hwms. Set by ledger_now, which every write operation calls
-- first.
local XK
local function ledger_now()
  if not TNOW then
    local t = redis.call('TIME')
    TNOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local now = TNOW
  if FLOOR > now then now = FLOOR end
  local k = KEYS[1]
  local m = MC[k]
  if not m or MG[k] ~= GEN then m = meta() end
  META.epoch, META.fence_s, META.pv_s = m[2], m[3], m[4]
  local hv = m[1]
  if hv == nil then return nil end
  if hv and hv > now then now = hv end
  XK = nil
  local nk = #KEYS
  if nk > 4 then
    local x = KEYS[nk]
    if byte(x, -1) == 109 and byte(x, -2) == 58 then -- ':m'
      XK = x
      local g = MC[x]
      if not g or MG[x] ~= GEN then g = meta(x) end
      hv = g[1]
      if hv == nil then return nil end
      if hv and hv > now then now = hv end
      META.xfence_s = g[3]
    end
  end
  return now
end

-- epoch_check adopts, creates or fences the tenant's epoch (LEDGER.md §6).
-- It returns the stored epoch and whether the caller must back off.
local function epoch_check(now)
  local cached, cand = ARGV[1], ARGV[2]
  local stored = META.epoch
  if not stored then
    local m = meta()
    redis.call('HSET', KEYS[1], 'epoch', cand)
    m[2] = cand
    if cached ~= '' then
      redis.call('HSET', KEYS[1], 'fence_until', now + tonumber(ARGV[3]), 'hwm', now)
      META.fence_s = tostring(now + tonumber(ARGV[3]))
      m[1], m[3] = now, META.fence_s
      return cand, true
    end
    return cand, false
  end
  if cached ~= '' and cached ~= stored then return stored, true end
  return stored, false
end

-- SPECS, AMTS and WIS cache parse_spec's, parse_amounts' and parse_wi's
-- work per text: for one call in a script, across calls in the function
-- library (see scripts.go; begin bounds them). Only the parse is shared:
-- amounts and windows are never modified, and every operation sets a spec's
-- mutable fields (key, counters) before it reads them (load_scope).
local SPECS, AMTS, WIS, NCACHED = {}, {}, {}, 0

-- parse_amounts parses n comma-separated amounts in 0..2^50, indexed from
-- 0; a.s[d] keeps each one's canonical text, a.nz lists the windowed
-- dimensions with an amount above 0 and a.m is their bit mask. Tables come
-- presized (ZA, ZS: scripts.go writes them for ledger.NumDims): growing a
-- table key by key costs a rehash per power of two, and rehashing was ~12 %
-- of the instructions.
local function parse_amounts(s)
  local a = AMTS[s]
  if a then return a end
  local t, n = ZS(), 0
  a = ZA()
  for f in gmatch(s, '[^,]+') do
    local v
    if f == '0' then
      v = 0
    else
      v = cint(f)
      if v == nil or v > MAXA then return nil end
    end
    a[n], t[n] = v, f
    n = n + 1
  end
  local nz, m = {}, 0
  for i = 1, #WD do local d = WD[i]
    if a[d] > 0 then
      nz[#nz + 1] = d
      m = m + 2 ^ d
    end
  end
  a.n, a.s, a.nz, a.m = n, t, nz, m
  AMTS[s], NCACHED = a, NCACHED + 1
  return a
end

-- Z0 is the amounts of an operation that moves no hold (a replay's
-- headroom, charge, dispatch): its scopes read only the limited r:<d>.
local Z0 = ZA()
Z0.nz = {}

-- parse_spec parses "<kind><key>/d:W:max:mode,...;..." (kind one digit,
-- W seconds, 0 for slots; mode b(lock) or w(arn)) and checks that KEYS[4+i]
-- ends with ":s:<key>" of scope i. scopes.wins lists the distinct windows
-- {w, ws} in the order of their "W:" text (the record's wi order).
-- Returns scopes or nil and a reason ('spec' or 'keys').
local function parse_spec(spec)
  if not spec or spec == '' then
    if #KEYS ~= 4 then return nil, 'keys' end
    return {wins = {}, wis = '', nx = 0}
  end
  local scopes = SPECS[spec]
  if not scopes then
    scopes = {wins = {}, wis = false, nx = 0}
    local seenw = {}
    for part in gmatch(spec, '[^;]+') do
      local name, lims = match(part, '^([^/]+)/(.*)$')
      if not name then return nil, 'spec' end
      -- r is kept for every windowed dimension, limited or not; fl caches
      -- per hold (its mask) what load_scope reads (scope_fields).
      local sc = {name = name, spec = part, lims = {}, dlist = WD, suf = ':s:' .. sub(name, 2),
        fl = {}, slot = false, key = false, vk = false, n = 0, seen = false, r = ZA(), c = false, d = false,
        x = false}
      for l in gmatch(lims, '[^,]+') do
        -- B and W: b and w of a global scope kept inline (see XK), which
        -- Sluice versions before it refuse as a bad spec, so they never act
        -- on such a record with keys of their own making.
        local d, w, mx, mode = match(l, '^(%d+):(%d+):(%d+):([bwBW])$')
        if not d then return nil, 'spec' end
        if mode == 'B' or mode == 'W' then
          mode = mode == 'B' and 'b' or 'w'
          if not sc.x then sc.x, scopes.nx = true, scopes.nx + 1 end
        end
        local lim = {d = d + 0, w = w + 0, max = mx + 0, mode = mode, ws = w, cf = false, wf = false,
          c = 0, widx = 0, cur = 0, idx = 0}
        if lim.max > MAXA then return nil, 'spec' end
        if lim.w == 0 then
          sc.slot = lim
        else
          lim.cf, lim.wf = 'c:' .. d .. ':' .. w, 'w:' .. d .. ':' .. w
          tinsert(sc.lims, lim)
          if not seenw[lim.w] then
            seenw[lim.w] = true
            tinsert(scopes.wins, {w = lim.w, ws = w, k = w .. ':', ix = false})
          end
        end
      end
      tinsert(scopes, sc)
    end
    table.sort(scopes.wins, function(x, y) return x.k < y.k end)
    SPECS[spec], NCACHED = scopes, NCACHED + 1
  end
  -- An inline global scope comes with its partition's meta key (XK), last.
  if scopes.nx > 1 or (XK ~= nil) ~= (scopes.nx == 1) then return nil, 'keys' end
  if #KEYS ~= 4 + #scopes + scopes.nx then return nil, 'keys' end
  for i = 1, #scopes do local sc = scopes[i]
    local k = KEYS[4 + i]
    -- A scope's key is the same text call after call: check it once.
    if k ~= sc.vk then
      local suf = sc.suf
      if #k <= #suf or sub(k, -#suf) ~= suf then return nil, 'keys' end
      sc.vk = k
    end
    sc.key = k
  end
  return scopes
end

-- Scope hashes are cached for the whole call: SC[key] holds every field
-- read (validated numbers; lim as text or false) or written this call, NL
-- for a field not read this call, and gen, the call it belongs to. SDT[key]
-- lists the fields written this call (d[1..d[0]]; d[f] is the call that
-- listed f), and SKL[1..SKN] the keys written, in order. Every read and
-- write of a scope hash goes through sload and sput/sadd (or, in the hot
-- loops, the same steps on sc.c and sc.d, with dirty called only for a
-- field's first write of the call), and flush writes each
-- dirty hash back with one HSET: a batch's operations on one scope cost one
-- HMGET and one HSET, and an operation's 4-7 HINCRBYs become part of one
-- HSET. Only fields read this call are written. The tables outlive the call
-- (in the function library): the next call fills the same names into the
-- same slots, where filling new tables rehashed each at every power of two
-- (~65 rehashes per operation). begin bounds them (MAXSC keys).
local SC, SDT, NSC, MAXSC = {}, {}, 0, 1024
local SKL, SKN = {}, 0
local NL = {} -- not read this call
local ARGS = {} -- flush's HSET arguments, reused

-- sfill stores the n fields names read as v into c (lim as text, the rest
-- as canonical integers) and returns c, or nil when one is corrupt (it and
-- the fields after it stay unread).
local function sfill(c, names, n, v)
  for i = 1, n do
    local name, x = names[i], v[i]
    if name == 'lim' then
      c.lim = x
    else
      local k = CI[x] or cint(x) -- (cint's memo, inline)
      if k == nil then
        for j = i, n do c[names[j]] = NL end
        return nil
      end
      c[name] = k
    end
  end
  return c
end

-- sload makes sure SC[key] holds the fields f (one HMGET of those missing)
-- and returns it, or nil when one of them is corrupt.
local function sload(key, f)
  local c = SC[key]
  if not c or c.gen ~= GEN then
    -- The call's first touch of key: forget the last call's values and read
    -- f. Where the last call read f and nothing else (lf, more: the same
    -- spec's operations, call after call), the HMGET overwrites every value.
    if not c then
      c = {}
      SC[key], SDT[key], NSC = c, {[0] = 0}, NSC + 1
    elseif c.lf ~= f or c.more then
      for name in pairs(c) do c[name] = NL end
    end
    c.gen, c.lf, c.more = GEN, f, false
    local r = sfill(c, f, #f, rcall('HMGET', key, unpack(f)))
    if not r then c.lf = false end
    return r
  end
  if c.lf == f then return c end -- read whole this call
  local miss, nm
  for i = 1, #f do
    local x = c[f[i]]
    if x == nil or x == NL then
      if not miss then miss, nm = {}, 0 end
      nm = nm + 1
      miss[nm] = f[i]
    end
  end
  if not miss then return c end
  c.more = true
  return sfill(c, miss, nm, rcall('HMGET', key, unpack(miss)))
end

-- dirty lists field f of key (its SDT d) as written this call.
local function dirty(key, d, f)
  d[f] = GEN
  local n = d[0] + 1
  d[0], d[n] = n, f
  if n == 1 then
    SKN = SKN + 1
    SKL[SKN] = key
  end
end

local function sput(key, f, v)
  SC[key][f] = v
  local d = SDT[key]
  if d[f] ~= GEN then dirty(key, d, f) end
end

-- sadd adds x to a field sload read (HINCRBY on the cache; callers checked
-- the range first).
local function sadd(key, f, x)
  local c = SC[key]
  c[f] = c[f] + x
  local d = SDT[key]
  if d[f] ~= GEN then dirty(key, d, f) end
end

-- scope_fields is what an operation moving the hold h reads of scope sc:
-- lim, n (when sc limits slots), r:<d> of the limited dimensions and of
-- those h holds (dims; no other r:<d> is read or written), c:<d>:<W> and
-- w:<d>:<W> per windowed limit. Cached in sc per mask of h.
local function scope_fields(sc, h)
  local need = {}
  for j = 1, #sc.lims do local l = sc.lims[j]; need[l.d] = true end
  for i = 1, #h.nz do local d = h.nz[i]; need[d] = true end
  local names, dims, rf = {'lim'}, {}, {}
  if sc.slot then names[2] = 'n' end
  for i = 1, #WD do local d = WD[i]
    if need[d] then
      dims[#dims + 1], rf[#rf + 1] = d, RF[d]
      names[#names + 1] = RF[d]
    end
  end
  for j = 1, #sc.lims do local l = sc.lims[j]
    names[#names + 1] = l.cf
    names[#names + 1] = l.wf
  end
  local f = {names = names, dims = dims, rf = rf}
  sc.fl[h.m] = f
  return f
end

-- load_scope reads and validates the counters of sc an operation moving the
-- hold h touches (scope_fields); sc.dlist is then the dimensions whose r it
-- read. Returns false on corruption.
local function load_scope(sc, h)
  local f = sc.fl[h.m] or scope_fields(sc, h)
  local key, names = sc.key, f.names
  local c = SC[key]
  -- (sload's fast path inline: read whole this call)
  if not c or c.gen ~= GEN or c.lf ~= names then
    c = sload(key, names)
    if not c then return false end
  end
  local dims = f.dims
  sc.seen, sc.dlist, sc.c, sc.d = c.lim, dims, c, SDT[key]
  if sc.slot then sc.n = c.n end
  local r, rf = sc.r, f.rf
  for i = 1, #dims do r[dims[i]] = c[rf[i]] end
  for j = 1, #sc.lims do local l = sc.lims[j]
    l.c, l.widx = c[l.cf], c[l.wf]
  end
  return true
end

-- window_of returns the current window index of W seconds at now ms,
-- remembering per W the last now asked (one call is one instant, so an
-- operation's limits and the call's operations ask the same; math.floor is
-- a C call). Bounded: it starts over after 64 windows.
local mfloor = math.floor
local WN, WX, NWN = {}, {}, 0
local function window_of(now, w)
  if WN[w] == now then return WX[w] end
  local ix = mfloor(now / (w * 1000))
  if not WN[w] then
    if NWN >= 64 then WN, WX, NWN = {}, {}, 0 end
    NWN = NWN + 1
  end
  WN[w], WX[w] = now, ix
  return ix
end

-- parse_wi parses a record's admission windows "W:idx,...".
local NOWI = {}
local function parse_wi(s)
  if not s then return NOWI end
  local t = WIS[s]
  if t then return t end
  t = {}
  for w, idx in gmatch(s, '(%d+):(%d+)') do t[w + 0] = idx + 0 end
  WIS[s], NCACHED = t, NCACHED + 1
  return t
end

-- Records are one string each: a head, struct.pack of RFMT (scripts.go):
-- the layout's version, st, le, te, sl, ra, ls, at as numbers (0 when
-- absent) and the lengths of o, dg, h, sp, wi, a, src, g, na; then those
-- nine texts ('' when absent), concatenated. One GET or SET moves a whole
-- record, where the hash layout before it (HFIELDS, every value text) took
-- an HMGET of 16 fields, an HSET of up to 10 and a PEXPIRE. The texts are
-- joined by one concatenation (memcpy): struct.pack copies byte by byte,
-- and cmsgpack interns every element as a Lua string first. Records of the
-- hash layout are still read, and written back packed by the next
-- operation that writes them (a rolling upgrade; docs/LEDGER.md §6).
local PACK = 1 -- the packed layout's version, its first element
local HFIELDS = {'st', 'o', 'dg', 'le', 'te', 'h', 'sp', 'wi', 'sl', 'a', 'src', 'ra', 'ls', 'at', 'g', 'na'}
local spack, sunpack = struct.pack, struct.unpack

-- pint validates a packed counter: an integer in 0..2^53-1, else nil.
local function pint(v)
  if v < 0 or v > MAXC or v % 1 ~= 0 then return nil end
  return v
end

-- read_record returns the record at key as a table of its fields (as
-- stored, nothing validated; packed is true for the packed layout), false
-- when there is none, nil when it does not decode.
local function read_record(key)
  local v = redis.pcall('GET', key)
  if not v then return false end
  if type(v) == 'string' then
    local ok, ver, st, le, te, sl, ra, ls, at, n1, n2, n3, n4, n5, n6, n7, n8, n9, p = pcall(sunpack, RFMT, v)
    if not ok or ver ~= PACK or p + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9 ~= #v + 1 then return nil end
    local o = sub(v, p, p + n1 - 1)
    p = p + n1
    local dg = sub(v, p, p + n2 - 1)
    p = p + n2
    local h = sub(v, p, p + n3 - 1)
    p = p + n3
    local sp = sub(v, p, p + n4 - 1)
    p = p + n4
    local wi = sub(v, p, p + n5 - 1)
    p = p + n5
    local a = false
    if n6 > 0 then a = sub(v, p, p + n6 - 1) end
    p = p + n6
    -- (often empty: a sub is a C call and a string)
    local src, g, na = '', '', ''
    if n7 > 0 then src = sub(v, p, p + n7 - 1) end
    p = p + n7
    if n8 > 0 then g = sub(v, p, p + n8 - 1) end
    p = p + n8
    if n9 > 0 then na = sub(v, p, p + n9 - 1) end
    return {st = st, o = o, dg = dg, le = le, te = te, h_s = h, sp = sp, wi_s = wi, sl = sl, a_s = a, src = src,
      ra = ra, ls = ls, at = at, g = g, na = na, h = false, a = false, wi = false, packed = true}
  end
  -- The hash layout (another type raises here, as any wrong type does).
  v = rcall('HMGET', key, unpack(HFIELDS))
  if not v[1] then return false end
  return {st = v[1], o = v[2], dg = v[3], le = v[4], te = v[5], h_s = v[6], sp = v[7], wi_s = v[8], sl = v[9],
    a_s = v[10], src = v[11], ra = v[12], ls = v[13], at = v[14], g = v[15] or '', na = v[16],
    h = false, a = false, wi = false, packed = false}
end

-- load_record reads the record scripts act on (KEYS[4]), validated; false
-- when there is none; nil, reason on corruption.
local function load_record(now)
  local rec = read_record(KEYS[4])
  if rec == nil then return nil, 'record' end
  if not rec then return false end
  if rec.packed then
    -- st and sl are bytes (B), integers already; le, te and ra are doubles.
    if rec.st < 1 or rec.st > 8 then return nil, 'state' end
    if not (pint(rec.le) and pint(rec.te) and pint(rec.ra)) then return nil, 'record' end
  else -- the hash layout: text
    rec.st, rec.le, rec.te, rec.sl, rec.ra = cint(rec.st), cint(rec.le), cint(rec.te), cint(rec.sl), cint(rec.ra)
    if rec.st == nil or rec.st < 1 or rec.st > 8 then return nil, 'state' end
    if rec.le == nil or rec.te == nil or rec.sl == nil or rec.ra == nil then return nil, 'record' end
  end
  if rec.te > 0 and now >= rec.te then return false, 'aged' end -- tombstone past retention
  local hs = rec.h_s or ''
  rec.h = AMTS[hs] or parse_amounts(hs)
  if rec.h == nil then return nil, 'held' end
  if rec.a_s then
    rec.a = AMTS[rec.a_s] or parse_amounts(rec.a_s)
    if rec.a == nil then return nil, 'actual' end
  end
  rec.wi = parse_wi(rec.wi_s)
  return rec
end

-- open_lease is how the lease operations (extend, grow) start: the record
-- must be RESERVED or DISPATCHED and held by ARGV[6]; a fence, an expired
-- or unresolved record or another owner means the caller lost its lease.
-- It returns nil, now, epoch, the record; or the refusal to answer.
local function open_lease()
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
  return nil, now, epoch, rec
end

-- record_or_none is load_record for scripts that mostly find no record
-- (reserve, charge); a GET of a missing key is already the cheapest read.
local record_or_none = load_record

-- store writes the record r (every field, packed) as KEYS[4]; px, when
-- given, is its time to live in ms (tombstones), else it has none.
local function store(r, px)
  local o, dg, h, sp, wi, a, src, g, na = r.o or '', r.dg or '', r.h_s or '', r.sp or '', r.wi_s or '', r.a_s or '',
    r.src or '', r.g or '', r.na or ''
  local v = spack(RFMT, PACK, r.st, r.le or 0, r.te or 0, r.sl or 0, r.ra or 0, r.ls or 0, r.at or 0,
    #o, #dg, #h, #sp, #wi, #a, #src, #g, #na) .. o .. dg .. h .. sp .. wi .. a .. src .. g .. na
  if px then
    rcall('SET', KEYS[4], v, 'PX', px)
  else
    rcall('SET', KEYS[4], v)
  end
end

-- check_release validates that r:<d> -= h[d] (and n -= 1 when slot) stays >= 0.
local function check_release(scopes, h, slot)
  for i = 1, #scopes do local sc = scopes[i]
    for j = 1, #sc.dlist do local d = sc.dlist[j]
      if sc.r[d] < h[d] then return false end
    end
    if slot and sc.slot and sc.n < 1 then return false end
  end
  return true
end

local function do_release(scopes, h, slot)
  for i = 1, #scopes do local sc = scopes[i]
    local key, c, sd, dl = sc.key, sc.c, sc.d, sc.dlist
    for j = 1, #dl do local d = dl[j]
      local x = h[d]
      if x > 0 then
        local f = RF[d]
        c[f] = c[f] - x
        if sd[f] ~= GEN then dirty(key, sd, f) end
      end
    end
    if slot and sc.slot then sadd(key, 'n', -1) end
  end
end

-- plan_charge decides which still-current admission windows receive a.
-- Returns the list of (sc, l, amt), flat (no table per entry), or nil on
-- corruption.
local function plan_charge(now, scopes, wi, a)
  local plan = {}
  for i = 1, #scopes do local sc = scopes[i]
    for j = 1, #sc.lims do local l = sc.lims[j]
      local amt = a[l.d]
      local adm = wi[l.w]
      if amt > 0 then
        if adm == nil then return nil end
        if l.widx < adm then return nil end
        if l.widx == adm and (WN[l.w] == now and WX[l.w] or window_of(now, l.w)) == adm then
          if l.c + amt > MAXC then return nil end
          local n = #plan
          plan[n + 1], plan[n + 2], plan[n + 3] = sc, l, amt
        end
      end
    end
  end
  return plan
end

local function do_charge(plan)
  for i = 1, #plan, 3 do
    local sc, f = plan[i], plan[i + 1].cf
    local c, sd = sc.c, sc.d
    c[f] = c[f] + plan[i + 2]
    if sd[f] ~= GEN then dirty(sc.key, sd, f) end
  end
end

-- finalize makes the record r (its fields as they end) a tombstone of state
-- st in ledger time and real time, and takes its id out of the index its
-- previous state prev is in (L for RESERVED and DISPATCHED, U for
-- UNRESOLVED; nil for a new record).
--
-- A SETTLED or SETTLED_LATE tombstone keeps no spec, admission windows or
-- owner: every later call on it is a replay, FINAL or CONFLICT, answered
-- from what it keeps, and those three were most of its bytes (tombstones
-- are most of a busy ledger's memory: an hour of them by default).
-- Operations on it then take the record's keys alone (an empty spec; a
-- caller that sends scope keys is answered KEYS ''). RELEASED and EXPIRED
-- keep theirs (a late Settle still charges their windows), and CHARGED
-- its spec (a Settle on it reports the actual to the usage log under the
-- request's scopes).
local function finalize(now, st, prev, r)
  r.st, r.te = st, now + ARGV[5]
  if st == S_SETTLED or st == S_SETTLED_LATE then r.sp, r.wi_s, r.o = '', '', '' end
  -- A global hold's request ('^T.id', global.go) matters only while the
  -- hold is open (Reclaim follows it); its tombstone keeps none.
  if r.g and r.g ~= '' and byte(r.g, 1) == 94 then r.g = '' end
  store(r, ARGV[5])
  if prev == S_RESERVED or prev == S_DISPATCHED then
    rcall('ZREM', KEYS[2], ARGV[4])
  elseif prev == S_UNRESOLVED then
    rcall('ZREM', KEYS[3], ARGV[4])
  end
end

-- touch raises the tenant's hwm to now (written by flush), and the global
-- partition's when the operation has XK; pv, when given, records the
-- tenant's policy version too.
local function touch(now, pv)
  local k = KEYS[1]
  local m = MC[k]
  if not m or MG[k] ~= GEN then m = meta() end
  m[1] = now
  if pv then m[4], MDP[k] = pv, GEN end
  if MD[k] ~= GEN then
    MD[k] = GEN
    MDN = MDN + 1
    MDL[MDN] = k
  end
  if XK then
    k = XK
    m = MC[k]
    if not m or MG[k] ~= GEN then m = meta(k) end
    m[1] = now -- (ledger_now made now at least its hwm)
    if MD[k] ~= GEN then
      MD[k] = GEN
      MDN = MDN + 1
      MDL[MDN] = k
    end
  end
end

-- flush writes what touch and sput deferred; every script calls it last.
local function flush()
  for i = 1, MDN do
    local k = MDL[i]
    local m = MC[k]
    if MDP[k] == GEN then
      rcall('HSET', k, 'hwm', fmtd(m[1]), 'pv', m[4])
    else
      rcall('HSET', k, 'hwm', fmtd(m[1]))
    end
  end
  MDN = 0
  local args = ARGS
  for i = 1, SKN do
    local key = SKL[i]
    local c, d = SC[key], SDT[key]
    local n = d[0]
    for j = 1, n do
      local f = d[j]
      local v = c[f]
      if f ~= 'lim' then v = FT[v] or fmtd(v) end
      args[2 * j - 1], args[2 * j] = f, v
    end
    d[0] = 0
    rcall('HSET', key, unpack(args, 1, 2 * n))
  end
  SKN = 0
end

-- resolve_at is when an UNRESOLVED record may be charged: the end of the first
-- of its admission windows to close (now if it has none).
local function resolve_at(wi)
  local t = MAXC -- no window: never charged automatically
  for w, idx in pairs(wi) do
    local e = (idx + 1) * w * 1000
    if e < t then t = e end
  end
  return t
end

-- note records in room the headroom of one limit where it is the tightest
-- of its dimension so far.
local function note(room, d, max, rem, w, resets)
  if rem < 0 then rem = 0 end
  local r = room[d]
  if not r or rem < r[3] or (rem == r[3] and resets > r[5]) then room[d] = {1, max, rem, w, resets} end
end

-- assess validates every counter of scopes and evaluates admission of h (with
-- a slot when dispatch). It returns nil, reason on corruption, else a table:
-- deny (budget), dslot (slots), room[d] = {1, max, remaining, W, resetsAt},
-- warns; each windowed limit's idx is its current window index.
local function assess(now, scopes, h, dispatch, epoch)
  local a = {room = ZF(), warns = false, deny = false, dslot = false}
  local room = a.room
  for si = 1, #scopes do local sc = scopes[si]
    if not load_scope(sc, h) then return nil, 'scope' end
    local r = sc.r
    for j = 1, #sc.dlist do local d = sc.dlist[j]
      if r[d] + h[d] > MAXC then return nil, 'overflow' end
    end
    for j = 1, #sc.lims do local l = sc.lims[j]
      local w = l.w
      local idx = WN[w] == now and WX[w] or window_of(now, w) -- (its memo, inline)
      if l.widx > idx then return nil, 'window' end
      l.idx = idx
      l.cur = l.c
      if l.widx < idx then l.cur = 0 end
      local hd = h[l.d]
      local resets = (idx + 1) * l.w * 1000
      local used = l.cur + r[l.d] + hd
      if l.mode == 'b' then
        if used > l.max and (not a.deny or resets > a.deny[10]) then
          a.deny = {'DENIED', epoch, si, l.d, l.w, l.max, l.cur, r[l.d], hd, resets, now}
        end
        note(room, l.d, l.max, l.max - used, l.w, resets)
      elseif used > l.max then
        if not a.warns then a.warns = {} end
        tinsert(a.warns, {si, l.d, l.w, l.max, used, resets})
      end
    end
    if sc.slot then
      local used = sc.n
      if dispatch then used = used + 1 end
      if sc.slot.mode == 'b' then
        if used > sc.slot.max and not a.dslot then
          a.dslot = {'DENIED', epoch, si, sc.slot.d, 0, sc.slot.max, 0, sc.n, 1, 0, now}
        end
        note(room, sc.slot.d, sc.slot.max, sc.slot.max - used, 0, 0)
      elseif used > sc.slot.max then
        if not a.warns then a.warns = {} end
        tinsert(a.warns, {si, sc.slot.d, 0, sc.slot.max, used, 0})
      end
    end
  end
  return a
end

-- append_room appends the number k of tracked dimensions, k x (dimension,
-- max, remaining, W, resetsAt) in dimension order, the number of warnings and
-- 6 fields per warning to out. Untracked dimensions are left out: every reply
-- element costs server CPU to encode, and most requests track 2 or 3 of 7.
local function append_room(out, a)
  local n = out.n + 1
  local cnt, k = n, 0
  out[cnt] = 0
  for d = 0, NDIMS - 1 do
    local r = a.room[d]
    if r then
      out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = d, r[2], r[3], r[4], r[5]
      n = n + 5
      k = k + 1
    end
  end
  out[cnt] = k
  local warns = a.warns or NOWI
  n = n + 1
  out[n] = #warns
  for i = 1, #warns do local w = warns[i]
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = w[1], w[2], w[3], w[4], w[5], w[6]
    n = n + 6
  end
  out[n + 1], out.n = nil, nil -- the reply ends at the first nil
  return out
end

-- R4 and R8 start a reply of 4 or 8 head elements that append_room
-- completes, presized (growing a table rehashes it at every power of two).
local function R4(a, b, c, d)
  return {a, b, c, d, false, false, false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false, false, false, n = 4}
end
local function R8(a, b, c, d, e, f, g, h)
  return {a, b, c, d, e, f, g, h, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false, false, false, n = 8}
end

-- begin starts a call (a script, or one call of the function library): one
-- call is one instant, so the clock starts empty and the meta and scope
-- caches' values are stale (GEN); the parse, meta and scope caches' tables
-- are kept, bounded.
local function begin(floor)
  FLOOR = tonumber(floor) or 0
  TNOW = nil
  MDN = 0 -- (left by a call that raised before its flush)
  if NMC > 1024 then MC, MG, MD, MDP, NMC = {}, {}, {}, {}, 0 end
  GEN = GEN + 1
  -- A call that raised before its flush left dirty marks: drop the caches.
  if SKN > 0 or NSC > MAXSC then SC, SDT, NSC, SKN = {}, {}, 0, 0 end
  if NCACHED > 4096 then SPECS, AMTS, WIS, NCACHED = {}, {}, {}, 0 end
end

local WIB = {} -- reserve_apply's window texts, reused

-- reserve_apply writes what reserve admitted and returns OK (pv_s: the
-- tenant's stored policy version).
local function reserve_apply(now, epoch, h, scopes, dispatch, ttl, a, pv_s)
  -- Apply (scope writes go to the call's cache, flushed once at the end).
  local le = now + ttl
  local sl = 0
  for i = 1, #scopes do local sc = scopes[i]
    local key = sc.key
    for j = 1, #sc.lims do local l = sc.lims[j]
      if l.widx < l.idx then
        sput(key, l.wf, l.idx)
        sput(key, l.cf, 0)
      end
    end
    local c, sd, dl = sc.c, sc.d, sc.dlist
    for j = 1, #dl do local d = dl[j]
      local x = h[d]
      if x > 0 then
        local f = RF[d]
        c[f] = c[f] + x
        if sd[f] ~= GEN then dirty(key, sd, f) end
      end
    end
    if dispatch and sc.slot then
      sadd(key, 'n', 1)
      sl = 1
    end
    if sc.seen ~= sc.spec then sput(key, 'lim', sc.spec) end
  end
  -- The record's wi text, kept in the (cached) spec while its windows'
  -- indexes stay (every Reserve of a window builds the same text).
  local wins, wis = scopes.wins, scopes.wis
  for i = 1, #wins do
    local w = wins[i]
    local ix = WN[w.w] == now and WX[w.w] or window_of(now, w.w)
    if w.ix ~= ix then w.ix, wis = ix, false end
  end
  if not wis then
    local wi = WIB
    for i = 1, #wins do wi[i] = wins[i].k .. wins[i].ix end
    wis = table.concat(wi, ',', 1, #wins)
    scopes.wis = wis
  end
  local st = S_RESERVED
  if dispatch then st = S_DISPATCHED end
  local o, dg, hs, sp, g, na = ARGV[7], ARGV[8], ARGV[11], ARGV[12], ARGV[13], ARGV[15]
  if na == '0' then na = '' end
  -- SET replaces an aged tombstone whole (and its time to live).
  rcall('SET', KEYS[4], spack(RFMT, PACK, st, le, 0, sl, 0, 0, now, #o, #dg, #hs, #sp, #wis, 0, 0, #g, #na) ..
    o .. dg .. hs .. sp .. wis .. g .. na)
  rcall('ZADD', KEYS[2], fmtd(le), ARGV[4])
  if pv_s ~= ARGV[6] then
    touch(now, ARGV[6])
  else
    touch(now)
  end
  return append_room(R4('OK', epoch, le, now), a)
end

-- reserve is the reserve script: every check before the first write, then
-- reserve_apply. It returns the reply (a refusal, a replay, CHECKED in mode
-- '2', or OK).
local function reserve()
  local now = ledger_now()
  if not now then return {'CORRUPT', '', 'hwm'} end
  local epoch, fenced = epoch_check(now)
  if fenced then return {'RECOVERING', epoch} end

  local h = AMTS[ARGV[11]] or parse_amounts(ARGV[11])
  if h == nil then return {'INVALID', epoch, 'held'} end
  local scopes, serr = parse_spec(ARGV[12])
  if not scopes then return {'POLICY', epoch, serr} end

  -- Idempotency first: an existing record answers the call.
  local rec, why = record_or_none(now)
  if rec == nil then return {'CORRUPT', epoch, why} end
  if rec then
    if not is_open(rec.st) then return {'FINAL', epoch, rec.st} end
    if rec.dg ~= ARGV[8] then return {'CONFLICT', epoch} end
    local a, aerr = assess(now, scopes, Z0, false, epoch)
    if not a then return {'CORRUPT', epoch, aerr} end
    local same = 0
    if ARGV[15] ~= '0' and rec.na == ARGV[15] then same = 1 end
    return append_room(R8('REPLAY', epoch, rec.o, rec.le, rec.st, now, rec.g, same), a)
  end
  if ARGV[14] == '1' then return {'NOREC', epoch} end

  local fence = cint(META.fence_s)
  if fence == nil then return {'CORRUPT', epoch, 'meta'} end
  if now < fence then return {'RECOVERING', epoch} end
  if XK then -- a fence on the global partition (set by a global hold's epoch check) holds here too
    fence = cint(META.xfence_s)
    if fence == nil then return {'CORRUPT', epoch, 'meta'} end
    if now < fence then return {'RECOVERING', epoch} end
  end
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
  return reserve_apply(now, epoch, h, scopes, dispatch, ttl, a, META.pv_s)
end

