package redisledger_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// advanceScript raises a tenant's high-water mark to max(TIME, hwm) + d ms,
// which moves that tenant's ledger time forward by d (Advance on Redis).
var advanceScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = tonumber(redis.call('HGET', KEYS[1], 'hwm') or '0')
if h > now then now = h end
now = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'hwm', now)
return now`)

// setTimeScript sets a tenant's hwm to an absolute ms value (must be ≥ TIME).
var setTimeScript = redis.NewScript(`redis.call('HSET', KEYS[1], 'hwm', ARGV[1]) return 1`)

func metaKey(tenant ledger.ScopeKey) string { return "sluice:{" + tenant.String() + "}:m" }

// advance moves tenant's ledger time forward by d and returns the new time.
func advance(t testing.TB, rc redis.UniversalClient, tenant ledger.ScopeKey, d time.Duration) time.Time {
	t.Helper()
	ms, err := advanceScript.Run(context.Background(), rc, []string{metaKey(tenant)}, d.Milliseconds()).Int64()
	require.NoError(t, err)
	return time.UnixMilli(ms)
}

// setLedgerTime sets tenant's ledger time (hwm) to at, which must be in the future.
func setLedgerTime(t testing.TB, rc redis.UniversalClient, tenant ledger.ScopeKey, at time.Time) {
	t.Helper()
	require.True(t, at.After(time.Now().Add(time.Second)), "ledger time can only be moved forward")
	require.NoError(t, setTimeScript.Run(context.Background(), rc, []string{metaKey(tenant)}, at.UnixMilli()).Err())
}

// dumpTenant returns DUMP of every key of a tenant, by key name.
func dumpTenant(t testing.TB, rc redis.UniversalClient, tenant ledger.ScopeKey) map[string]string {
	t.Helper()
	ctx := context.Background()
	if cc, ok := rc.(*redis.ClusterClient); ok {
		rc = nodeOf(t, cc, tenant) // SCAN reads one node: the one with the tenant's slot
	}
	out := map[string]string{}
	iter := rc.Scan(ctx, 0, "sluice:{"+tenant.String()+"}:*", 100).Iterator()
	for iter.Next(ctx) {
		v, err := rc.Dump(ctx, iter.Val()).Result()
		require.NoError(t, err)
		out[iter.Val()] = v
	}
	require.NoError(t, iter.Err())
	return out
}

func sortedKeys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}

// recordFieldNames are a packed record's fields after its version, in
// redisledger.RecordFormat's order; the older hash layout has the same names.
var recordFieldNames = []string{"st", "le", "te", "sl", "ra", "ls", "at", "o", "dg", "h", "sp", "wi", "a", "src", "g", "na"}

// recordLua decodes a packed record v into t: t[1] the version, then the
// fields in recordFieldNames' order.
const recordLua = `
local function decode(fmt, v)
  local t = {struct.unpack(fmt, v)}
  local p = t[18]
  for i = 9, 17 do
    local n = t[i]
    t[i] = string.sub(v, p, p + n - 1)
    p = p + n
  end
  t[18] = nil
  return t
end
local function encode(fmt, t)
  local args, texts = {fmt}, {}
  for i = 1, 8 do args[#args + 1] = t[i] end
  for i = 9, 17 do
    args[#args + 1] = #t[i]
    texts[#texts + 1] = t[i]
  end
  return struct.pack(unpack(args)) .. table.concat(texts)
end
`

// recordScript returns a record's fields as a flat name, value list (its
// present fields, as text; a zero number or an empty text is absent), for
// either layout. ARGV 1 the format, then the field names.
var recordScript = redis.NewScript(recordLua + `
local v = redis.pcall('GET', KEYS[1])
if not v then return {} end
if type(v) ~= 'string' then return redis.call('HGETALL', KEYS[1]) end
local t = decode(ARGV[1], v)
local out = {}
for i = 2, #ARGV do
  local x = t[i]
  if x ~= 0 and x ~= '' then
    out[#out + 1] = ARGV[i]
    if type(x) == 'number' then x = string.format('%d', x) end
    out[#out + 1] = x
  end
end
return out`)

// setRecordFieldScript sets one field of a packed record (KEEPTTL). ARGV 1
// the format, 2 the field's position after the version, 3 its value.
var setRecordFieldScript = redis.NewScript(recordLua + `
local t = decode(ARGV[1], redis.call('GET', KEYS[1]))
local i = tonumber(ARGV[2]) + 1
if i <= 8 then t[i] = tonumber(ARGV[3]) else t[i] = ARGV[3] end
redis.call('SET', KEYS[1], encode(ARGV[1], t), 'KEEPTTL')
return 1`)

// recordFields returns the record at key, field by field (empty: none).
func recordFields(ctx context.Context, rc redis.UniversalClient, key string) (map[string]string, error) {
	args := []any{redisledger.RecordFormat}
	for _, n := range recordFieldNames {
		args = append(args, n)
	}
	flat, err := recordScript.Run(ctx, rc, []string{key}, args...).StringSlice()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for i := 0; i+1 < len(flat); i += 2 {
		m[flat[i]] = flat[i+1]
	}
	return m, nil
}

// setRecordField sets field name of the packed record at key to v.
func setRecordField(ctx context.Context, rc redis.UniversalClient, key, name, v string) error {
	for i, n := range recordFieldNames {
		if n == name {
			return setRecordFieldScript.Run(ctx, rc, []string{key}, redisledger.RecordFormat, i+1, v).Err()
		}
	}
	return fmt.Errorf("no record field %q", name)
}
