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
local SS = {'1', '2', '3', '4', '5', '6', '7', '8'} -- states as stored

-- cint parses a stored counter: missing is 0, anything but 0..2^53-1 written
-- canonically (no sign, no leading zero, as HINCRBY writes and requires) is
-- nil (corrupt), so no later HINCRBY can fail half-way through a script.
local function cint(v)
  if not v then return 0 end
  if type(v) == 'number' then return v end -- written by this script (meta cache)
  if v == '0' then return 0 end
  if type(v) ~= 'string' or #v > 16 or not string.find(v, '^[1-9]%d*$') then return nil end
  local n = tonumber(v)
  if n > MAXC then return nil end
  return n
end

-- The last ARGV of every script is a clock floor in ms: 0 in production; the
-- conformance tests pin ledger time with it.
local FLOOR = tonumber(ARGV[#ARGV]) or 0

-- META holds the tenant meta hash fields read once by ledger_now.
local META = {}
-- One script call is one instant: TIME is read once (TNOW, ms), and each
-- meta hash once (MC: {hwm, epoch, fence_until, pv} as read or as written
-- since). hwm and pv are written back once per meta key by flush, at the
-- end of the call (a batch of operations on one tenant writes its hwm once).
local TNOW
local MC, MDIRTY = {}, {}

local function meta()
  local m = MC[KEYS[1]]
  if not m then
    m = redis.call('HMGET', KEYS[1], 'hwm', 'epoch', 'fence_until', 'pv')
    MC[KEYS[1]] = m
  end
  return m
end

local function ledger_now()
  if not TNOW then
    local t = redis.call('TIME')
    TNOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local now = TNOW
  if FLOOR > now then now = FLOOR end
  local m = meta()
  META.epoch, META.fence_s, META.pv_s = m[2], m[3], m[4]
  if m[1] then
    local hv = cint(m[1])
    if hv == nil then return nil end
    if hv > now then now = hv end
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

-- parse_amounts parses n comma-separated amounts in 0..2^50, indexed from
-- 0; a.s[d] keeps each one's canonical text, which HINCRBY takes as is
-- (a Lua number argument costs Redis a printf).
local function parse_amounts(s)
  local a, n, t = {}, 0, {}
  for f in string.gmatch(s, '[^,]+') do
    local v = cint(f)
    if v == nil or v > MAXA then return nil end
    a[n], t[n] = v, f
    n = n + 1
  end
  a.n, a.s = n, t
  return a
end

-- SPECS caches parse_spec's work per spec text for the length of one script
-- call: the operations of a batch on one tenant share their spec. Only the
-- parse is shared; every operation sets the mutable fields (key, counters)
-- before it reads them (load_scope).
local SPECS = {}

-- parse_spec parses "<kind><key>/d:W:max:mode,...;..." (kind one digit,
-- W seconds, 0 for slots; mode b(lock) or w(arn)) and checks that KEYS[4+i]
-- ends with ":s:<key>" of scope i.
-- Returns scopes or nil and a reason ('spec' or 'keys').
local function parse_spec(spec)
  if not spec or spec == '' then
    if #KEYS ~= 4 then return nil, 'keys' end
    return {}
  end
  local scopes = SPECS[spec]
  if not scopes then
    scopes = {}
    for part in string.gmatch(spec, '[^;]+') do
      local name, lims = string.match(part, '^([^/]+)/(.*)$')
      if not name then return nil, 'spec' end
      -- r is kept for every windowed dimension, limited or not. fields are
      -- what load_scope reads: n, lim, r:<d>..., then c:<d>:<W>, w:<d>:<W>
      -- per windowed limit (names built from the spec's own digits).
      local sc = {name = name, spec = part, lims = {}, dlist = WD, suf = ':s:' .. string.sub(name, 2),
        fields = {'n', 'lim'}}
      for _, d in ipairs(WD) do sc.fields[#sc.fields + 1] = RF[d] end
      for l in string.gmatch(lims, '[^,]+') do
        local d, w, mx, mode = string.match(l, '^(%d+):(%d+):(%d+):([bw])$')
        if not d then return nil, 'spec' end
        local lim = {d = tonumber(d), w = tonumber(w), max = tonumber(mx), mode = mode, ws = w}
        if lim.max > MAXA then return nil, 'spec' end
        if lim.w == 0 then
          sc.slot = lim
        else
          lim.cf, lim.wf = 'c:' .. d .. ':' .. w, 'w:' .. d .. ':' .. w
          sc.fields[#sc.fields + 1] = lim.cf
          sc.fields[#sc.fields + 1] = lim.wf
          table.insert(sc.lims, lim)
        end
      end
      table.insert(scopes, sc)
    end
    SPECS[spec] = scopes
  end
  if #KEYS ~= 4 + #scopes then return nil, 'keys' end
  for i, sc in ipairs(scopes) do
    local k, suf = KEYS[4 + i], sc.suf
    if #k <= #suf or string.sub(k, -#suf) ~= suf then return nil, 'keys' end
    sc.key = k
  end
  return scopes
end

-- load_scope reads and validates the counters a spec touches: n, r:<d>,
-- c:<d>:<W> and w:<d>:<W> (and o:<d> when overrun is set). Returns false on
-- corruption.
local function load_scope(sc, overrun)
  local f = sc.fields
  if overrun then
    f = {unpack(f)}
    for _, d in ipairs(WD) do f[#f + 1] = OF[d] end
  end
  local v = redis.call('HMGET', sc.key, unpack(f))
  sc.seen = v[2]
  local n = cint(v[1])
  if n == nil then return false end
  sc.n = n
  sc.r, sc.o = {}, {}
  for j, d in ipairs(WD) do
    local r = cint(v[2 + j])
    if r == nil then return false end
    sc.r[d] = r
  end
  local i = 3 + #WD
  for _, l in ipairs(sc.lims) do
    local c, w = cint(v[i]), cint(v[i + 1])
    if c == nil or w == nil then return false end
    l.c, l.widx = c, w
    i = i + 2
  end
  if overrun then
    for j, d in ipairs(WD) do
      local o = cint(v[i + j - 1])
      if o == nil then return false end
      sc.o[d] = o
    end
  end
  return true
end

-- window_of returns the current window index of W seconds at now ms.
local function window_of(now, w) return math.floor(now / (w * 1000)) end

-- parse_wi parses a record's admission windows "W:idx,...".
local function parse_wi(s)
  local t = {}
  if not s then return t end
  for w, idx in string.gmatch(s, '(%d+):(%d+)') do t[tonumber(w)] = tonumber(idx) end
  return t
end

-- record reads the record fields scripts need, validated; nil, reason on corruption.
local function load_record(now)
  local v = redis.call('HMGET', KEYS[4], 'st', 'o', 'dg', 'le', 'te', 'h', 'sp', 'wi', 'sl', 'a', 'src', 'ra', 'ls', 'at', 'g', 'na')
  if not v[1] then return false end
  local rec = {o = v[2], dg = v[3], sp = v[7], wi_s = v[8], a_s = v[10], src = v[11], h_s = v[6], ls = v[13], at = v[14], g = v[15] or '', na = v[16]}
  rec.st = cint(v[1])
  if rec.st == nil or rec.st < 1 or rec.st > 8 then return nil, 'state' end
  rec.le, rec.te, rec.sl, rec.ra = cint(v[4]), cint(v[5]), cint(v[9]), cint(v[12])
  if rec.le == nil or rec.te == nil or rec.sl == nil or rec.ra == nil then return nil, 'record' end
  if v[5] and now >= rec.te then return false, 'aged' end -- tombstone past retention
  rec.h = parse_amounts(v[6] or '')
  if rec.h == nil then return nil, 'held' end
  if v[10] then
    rec.a = parse_amounts(v[10])
    if rec.a == nil then return nil, 'actual' end
  end
  rec.wi = parse_wi(v[8])
  return rec
end

-- check_release validates that r:<d> -= h[d] (and n -= 1 when slot) stays >= 0.
local function check_release(scopes, h, slot)
  for _, sc in ipairs(scopes) do
    for _, d in ipairs(sc.dlist) do
      if sc.r[d] < (h[d] or 0) then return false end
    end
    if slot and sc.slot and sc.n < 1 then return false end
  end
  return true
end

local function do_release(scopes, h, slot)
  for _, sc in ipairs(scopes) do
    for _, d in ipairs(sc.dlist) do
      if (h[d] or 0) > 0 then redis.call('HINCRBY', sc.key, RF[d], '-' .. h.s[d]) end
    end
    if slot and sc.slot then redis.call('HINCRBY', sc.key, 'n', '-1') end
  end
end

-- plan_charge decides which still-current admission windows receive a.
-- Returns the list of {sc, l} or nil on corruption.
local function plan_charge(now, scopes, wi, a)
  local plan = {}
  for _, sc in ipairs(scopes) do
    for _, l in ipairs(sc.lims) do
      local amt = a[l.d] or 0
      local adm = wi[l.w]
      if amt > 0 then
        if adm == nil then return nil end
        if l.widx < adm then return nil end
        if l.widx == adm and window_of(now, l.w) == adm then
          if l.c + amt > MAXC then return nil end
          table.insert(plan, {sc = sc, l = l, amt = a.s[l.d]})
        end
      end
    end
  end
  return plan
end

local function do_charge(plan)
  for _, p in ipairs(plan) do
    redis.call('HINCRBY', p.sc.key, p.l.cf, p.amt)
  end
end

-- finalize makes the record a tombstone in ledger time and real time,
-- writing the extra record fields given, and takes its id out of the index
-- its previous state prev is in (L for RESERVED and DISPATCHED, U for
-- UNRESOLVED; nil for a new record).
local function finalize(now, st, prev, ...)
  redis.call('HSET', KEYS[4], 'st', SS[st], 'te', now + tonumber(ARGV[5]), ...)
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
  if prev == S_RESERVED or prev == S_DISPATCHED then
    redis.call('ZREM', KEYS[2], ARGV[4])
  elseif prev == S_UNRESOLVED then
    redis.call('ZREM', KEYS[3], ARGV[4])
  end
end

-- touch raises the tenant's hwm to now (written by flush); pv, when given,
-- records the policy version too.
local function touch(now, pv)
  local m = meta()
  m[1] = now
  if pv then m[4] = pv end
  local d = MDIRTY[KEYS[1]]
  if not d then
    d = {m = m}
    MDIRTY[KEYS[1]] = d
  end
  if pv then d.pv = true end
end

-- flush writes the meta fields touch deferred; every script calls it last.
local function flush()
  for k, d in pairs(MDIRTY) do
    if d.pv then
      redis.call('HSET', k, 'hwm', d.m[1], 'pv', d.m[4])
    else
      redis.call('HSET', k, 'hwm', d.m[1])
    end
  end
  MDIRTY = {}
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

-- assess validates every counter of scopes and evaluates admission of h (with
-- a slot when dispatch). It returns nil, reason on corruption, else a table:
-- deny (budget), dslot (slots), room[d] = {1, max, remaining, W, resetsAt},
-- warns, widx[W] = current window index.
local function assess(now, scopes, h, dispatch, epoch)
  local a = {room = {}, warns = {}, widx = {}, wws = {}}
  local function note(d, max, rem, w, resets)
    if rem < 0 then rem = 0 end
    local r = a.room[d]
    if r == nil or rem < r[3] or (rem == r[3] and resets > r[5]) then a.room[d] = {1, max, rem, w, resets} end
  end
  for si, sc in ipairs(scopes) do
    if not load_scope(sc) then return nil, 'scope' end
    for _, d in ipairs(sc.dlist) do
      if sc.r[d] + (h[d] or 0) > MAXC then return nil, 'overflow' end
    end
    for _, l in ipairs(sc.lims) do
      local idx = window_of(now, l.w)
      if l.widx > idx then return nil, 'window' end
      a.widx[l.w], a.wws[l.w] = idx, l.ws
      l.cur = l.c
      if l.widx < idx then l.cur = 0 end
      local hd = h[l.d] or 0
      local resets = (idx + 1) * l.w * 1000
      local used = l.cur + sc.r[l.d] + hd
      if l.mode == 'b' then
        if used > l.max and (a.deny == nil or resets > a.deny[10]) then
          a.deny = {'DENIED', epoch, si, l.d, l.w, l.max, l.cur, sc.r[l.d], hd, resets, now}
        end
        note(l.d, l.max, l.max - used, l.w, resets)
      elseif used > l.max then
        table.insert(a.warns, {si, l.d, l.w, l.max, used, resets})
      end
    end
    if sc.slot then
      local used = sc.n
      if dispatch then used = used + 1 end
      if sc.slot.mode == 'b' then
        if used > sc.slot.max and a.dslot == nil then
          a.dslot = {'DENIED', epoch, si, sc.slot.d, 0, sc.slot.max, 0, sc.n, 1, 0, now}
        end
        note(sc.slot.d, sc.slot.max, sc.slot.max - used, 0, 0)
      elseif used > sc.slot.max then
        table.insert(a.warns, {si, sc.slot.d, 0, sc.slot.max, used, 0})
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
  local n = #out + 1
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
  local warns = a.warns
  n = n + 1
  out[n] = #warns
  for _, w in ipairs(warns) do
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = w[1], w[2], w[3], w[4], w[5], w[6]
    n = n + 6
  end
  return out
end
