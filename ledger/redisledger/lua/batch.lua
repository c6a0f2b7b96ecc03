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
local function run_batch(ALLK, ALLA)
  begin(ALLA[#ALLA])
  local out = {}
  local ki, ai = 1, 2
  for i = 1, tonumber(ALLA[1]) do
    -- (cint and its memo: tonumber is a C call and two strtods)
    local name, nk, na = ALLA[ai], ALLA[ai + 1], ALLA[ai + 2]
    nk, na = CI[nk] or cint(nk), CI[na] or cint(na)
    ai = ai + 3
    KEYS = {unpack(ALLK, ki, ki + nk - 1)}
    ARGV = {unpack(ALLA, ai, ai + na - 1)}
    ki, ai = ki + nk, ai + na
    local fn = OPS[name]
    if not fn then
      out[i] = {'LUAERR', 'unknown operation ' .. tostring(name)}
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
