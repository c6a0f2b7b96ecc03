-- Line-level profile of the ledger's function library, outside Redis: runs
-- the library's code (as FUNCTION LIST WITHCODE shows it) in lua5.1 with
-- redis.call and struct mocked, on FCALLs captured from a real run, and
-- counts per line the VM instructions executed (prof), the calls made per
-- call site (calls) or the bytes allocated (mem); check prints every reply
-- and the final keys instead, to compare two versions' behaviour on the same
-- capture (KEEP=a luaprof.sh <old binary>, KEEP=b luaprof.sh <new binary>,
-- then diff the check output of a/lib.lua and b/lib.lua on a/calls.lua;
-- both versions must take the same FCALL arguments). The mock's TIME
-- advances 20 ms per call, the same every run.
-- Usage (luaprof.sh runs it): lua5.1 luaprof.lua lib.lua calls.lua [prof|calls|mem|check] [lines]
local libsrc = io.open(arg[1]):read('*a'):gsub('^#![^\n]*\n', '-- (shebang)\n')
local calls = dofile(arg[2])
local mode, top = arg[3] or 'prof', tonumber(arg[4] or 40)
local SKIP = 20 -- calls run before counting (caches warm up)

local DB, TCALL = {}, 0
local function tostr(v) if type(v) == 'number' then return string.format('%.17g', v) end return v end
local function call(cmd, ...)
  local a = {...}
  cmd = cmd:upper()
  if cmd == 'TIME' then
    TCALL = TCALL + 1
    return {tostring(1796189689 + math.floor(TCALL / 50)), tostring((TCALL % 50) * 20000)}
  elseif cmd == 'HMGET' then
    local h, r = DB[a[1]] or {}, {}
    for i = 2, #a do r[i - 1] = h[a[i]] or false end
    return r
  elseif cmd == 'HGET' then return (DB[a[1]] or {})[a[2]] or false
  elseif cmd == 'HSET' then
    local h = DB[a[1]] or {}
    DB[a[1]] = h
    for i = 2, #a, 2 do h[a[i]] = tostr(a[i + 1]) end
    return 1
  elseif cmd == 'GET' then
    local v = DB[a[1]]
    if v == nil then return false end
    if type(v) ~= 'string' then error({err = 'WRONGTYPE'}) end
    return v
  elseif cmd == 'SET' then DB[a[1]] = tostr(a[2]); return {ok = 'OK'}
  elseif cmd == 'ZADD' then local z = DB[a[1]] or {}; DB[a[1]] = z; z[a[3]] = tostr(a[2]); return 1
  elseif cmd == 'ZREM' then local z = DB[a[1]] or {}; DB[a[1]] = z; z[a[2]] = nil; return 1
  elseif cmd == 'ZSCORE' then return (DB[a[1]] or {})[a[2]] or false
  elseif cmd == 'PEXPIRE' then return 1
  end
  error('luaprof: no mock for ' .. cmd)
end
-- struct: the record head is mocked as 128 bytes of space-separated numbers
-- (the code only needs unpack to return what pack was given, and the offset).
local W = 128
local struct = {
  pack = function(f, ...)
    local t = {...}
    for i = 1, #t do t[i] = string.format('%.17g', t[i]) end
    local s = table.concat(t, ' ')
    return s .. string.rep(' ', W - #s)
  end,
  unpack = function(f, v)
    local t = {}
    for x in v:sub(1, W):gmatch('%S+') do t[#t + 1] = tonumber(x) end
    t[#t + 1] = W + 1
    return unpack(t)
  end,
}
local fn
local env = setmetatable({struct = struct, redis = {call = call, pcall = call,
  register_function = function(_, f) fn = f end}}, {__index = _G})
local chunk = assert(loadstring(libsrc, '=lib'))
setfenv(chunk, env)
chunk()

local lines = {}
for l in (libsrc .. '\n'):gmatch('(.-)\n') do lines[#lines + 1] = l end
local count, bytes, cc, last, lastm = {}, {}, {}, nil, 0
local function prof()
  local i = debug.getinfo(2, 'Sl')
  if i.source == '=lib' then count[i.currentline] = (count[i.currentline] or 0) + 1 end
end
local function ccall()
  local i = debug.getinfo(2, 'Sn')
  local p = debug.getinfo(3, 'Sl')
  if p and p.source == '=lib' and (i.what == 'C' or i.source == '=lib') then
    local k = (i.name or '?') .. ' from line ' .. p.currentline
    cc[k] = (cc[k] or 0) + 1
  end
end
local function mem()
  local m = collectgarbage('count')
  if last then bytes[last] = (bytes[last] or 0) + (m - lastm) * 1024 end
  local i = debug.getinfo(2, 'Sl')
  last = i.source == '=lib' and i.currentline or 0
  lastm = collectgarbage('count')
end
local function ser(v)
  if type(v) ~= 'table' then return tostring(v) end
  local t, i = {}, 1
  while v[i] ~= nil do t[i] = ser(v[i]); i = i + 1 end -- a reply ends at its first nil
  return '{' .. table.concat(t, ',') .. '}'
end

local ops = 0
for i, c in ipairs(calls) do
  if i > SKIP then
    ops = ops + tonumber(c.args[1])
    if mode == 'prof' then debug.sethook(prof, '', 1)
    elseif mode == 'calls' then debug.sethook(ccall, 'c')
    elseif mode == 'mem' then collectgarbage('stop'); last = nil; debug.sethook(mem, '', 1) end
  end
  local r = fn(c.keys, c.args)
  debug.sethook()
  if mode == 'check' then print(ser(r)) end
end
if mode == 'check' then
  local keys = {}
  for k in pairs(DB) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = DB[k]
    if type(v) == 'table' then
      local f = {}
      for x, y in pairs(v) do f[#f + 1] = x .. '=' .. tostring(y) end
      table.sort(f)
      v = table.concat(f, ' ')
    end
    print(k, v)
  end
  return
end
local t = ({prof = count, calls = cc, mem = bytes})[mode]
local ks, total = {}, 0
for k, n in pairs(t) do ks[#ks + 1] = k; total = total + n end
table.sort(ks, function(a, b) return t[a] > t[b] end)
print(string.format('%s: %.1f per operation over %d operations', mode, total / ops, ops))
for i = 1, math.min(#ks, top) do
  local k = ks[i]
  local what = mode == 'calls' and k or string.format('%5d: %s', k, lines[k] or '(outside the library)')
  print(string.format('%8.1f %5.1f%%  %s', t[k] / ops, 100 * t[k] / total, what))
end
