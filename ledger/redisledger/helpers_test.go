package redisledger_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
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
func dumpTenant(t testing.TB, rc *redis.Client, tenant ledger.ScopeKey) map[string]string {
	t.Helper()
	ctx := context.Background()
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
