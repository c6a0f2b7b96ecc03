-- batch: runs several operations, each exactly as its own script would, one
-- after another inside this one call (so the batch is atomic and equal to
-- running them in order). ARGV: 1 the number of operations, then per
-- operation its name, its number of keys, its number of arguments and the
-- arguments; KEYS are every operation's keys in order; the last ARGV is the
-- clock floor. The reply has one element per operation: that operation's
-- reply, or {'LUAERR', message} when a redis.call raised (the others still
-- run; like a single script, an operation reads everything before it
-- writes, so a raising one wrote nothing). run_batch is the body of the
-- batch script and of the library's function (scripts.go).
--
-- On a Cluster one call carries the operations of several slots served by
-- one node (run_batch_x, the library's cross-slot function). Redis checked
-- only the declared keys, the first operation's, before the call; every
-- later operation first probes its own keys with one EXISTS, which raises
-- where its slot is not served here whole (moved, or migrating with some of
-- its keys gone), and such an operation answers TRYAGAIN without reading or
-- writing anything. A slot cannot move while the call runs, so an operation
-- whose probe passed finds every key it touches.
-- probe answers why an operation's keys are not all served here, or false.
local EXISTS = 'EXISTS'
local function probe(keys)
  local r = redis.pcall(EXISTS, unpack(keys))
  if type(r) == 'table' and r.err then return tostring(r.err) end
  return false
end
local function run_batch(ALLK, ALLA, a0, declared)
  begin(ALLA[#ALLA])
  local out = {}
  local ki, ai = 1, a0 + 2
  for i = 1, tonumber(ALLA[a0 + 1]) do
    -- (cint and its memo: tonumber is a C call and two strtods)
    local name, nk, na = ALLA[ai], ALLA[ai + 1], ALLA[ai + 2]
    nk, na = CI[nk] or cint(nk), CI[na] or cint(na)
    ai = ai + 3
    KEYS = {unpack(ALLK, ki, ki + nk - 1)}
    ARGV = {unpack(ALLA, ai, ai + na - 1)}
    local refused = ki > declared and nk > 0 and probe(KEYS) -- (one server: false, no C call)
    ki, ai = ki + nk, ai + na
    local fn = OPS[name]
    if not fn then
      out[i] = {'LUAERR', 'unknown operation ' .. tostring(name)}
    elseif refused then
      out[i] = {'LUAERR', 'TRYAGAIN ' .. refused}
    else
      local ok, r = pcall(fn)
      if ok then
        out[i] = r
      else
        if type(r) == 'table' then r = r.err end
        out[i] = {'LUAERR', tostring(r)}
      end
    end
  end
  flush()
  return out
end

-- run_batch_x runs a cross-slot batch: KEYS are the first operation's keys,
-- ARGV[1] the number m of the other operations' keys, ARGV[2..m+1] those
-- keys, then the arguments run_batch takes.
local function run_batch_x(K, A)
  local nd, m = #K, tonumber(A[1])
  for i = 2, m + 1 do K[nd + i - 1] = A[i] end
  return run_batch(K, A, m + 1, nd)
end
