package peers_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/scheduler/peers"
)

func client(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestExchange: each instance sees the others' latest reports, never its
// own; a report replaces the instance's previous one; Leave removes it.
func TestExchange(t *testing.T) {
	addr := redistest.Start(t)
	ctx := t.Context()
	a := peers.NewRedis(client(t, addr), "t", "a", "h1", time.Minute)
	b := peers.NewRedis(client(t, addr), "t", "b", "h1", time.Minute)

	got, err := a.Exchange(ctx, []peers.Report{{Replica: "http://r1:8000", InFlight: 3, Queued: 9}})
	require.NoError(t, err)
	assert.Empty(t, got, "alone")

	got, err = b.Exchange(ctx, []peers.Report{{Replica: "http://r1:8000", InFlight: 1}, {Replica: "http://r2:8000", Queued: 2}})
	require.NoError(t, err)
	assert.Equal(t, map[string][]peers.Entry{"http://r1:8000": {{Instance: "a", InFlight: 3, Queued: 9}}}, got)

	got, err = a.Exchange(ctx, nil) // a now has nothing anywhere
	require.NoError(t, err)
	assert.Equal(t, map[string][]peers.Entry{
		"http://r1:8000": {{Instance: "b", InFlight: 1}},
		"http://r2:8000": {{Instance: "b", Queued: 2}},
	}, got)
	got, err = b.Exchange(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, got, "a's earlier report was replaced")

	require.NoError(t, b.Leave(ctx))
	got, err = a.Exchange(ctx, []peers.Report{{Replica: "http://r1:8000", InFlight: 1}})
	require.NoError(t, err)
	assert.Empty(t, got, "b left")

	_, err = a.Exchange(ctx, []peers.Report{{Replica: "http://r 1"}})
	require.ErrorContains(t, err, "cannot be reported")
}

// TestStaleReportsAgeOut: a report stamped (by Redis's clock) longer ago
// than the bound is ignored and removed; a malformed one is left out
// whole and named, and the others' still count.
func TestStaleReportsAgeOut(t *testing.T) {
	addr := redistest.Start(t)
	ctx := t.Context()
	c := client(t, addr)
	a := peers.NewRedis(c, "t", "a", "h1", 2*time.Second)
	tm, err := c.Time(ctx).Result()
	require.NoError(t, err)
	old := tm.Add(-3 * time.Second).UnixMilli()
	fresh := tm.Add(-time.Second).UnixMilli()
	require.NoError(t, c.HSet(ctx, "t:{peers}", "crashed", fmt.Sprintf("%d http://r1 4 4", old), "live", fmt.Sprintf("%d http://r1 2 0", fresh)).Err())

	got, err := a.Exchange(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[string][]peers.Entry{"http://r1": {{Instance: "live", InFlight: 2}}}, got)
	ids, err := c.HKeys(ctx, "t:{peers}").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"a", "live"}, ids, "the stale report is removed")

	require.NoError(t, c.HSet(ctx, "t:{peers}", "bad", fmt.Sprintf("%d http://r2 1 1 http://r1 x 0", fresh)).Err())
	got, err = a.Exchange(ctx, nil)
	require.ErrorIs(t, err, peers.ErrMalformed)
	require.ErrorContains(t, err, `instance "bad"`)
	assert.Equal(t, map[string][]peers.Entry{"http://r1": {{Instance: "live", InFlight: 2}}}, got, "the others' still count; none of the bad one's")
}

// TestKey: a loopback URL is qualified by the host (every node's
// 127.0.0.1:8000 is its own vLLM), any other URL is the replica's name.
func TestKey(t *testing.T) {
	a := peers.NewRedis(nil, "t", "a", "node-1", time.Minute)
	b := peers.NewRedis(nil, "t", "b", "node-2", time.Minute)
	for _, u := range []string{"http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "http://127.0.0.2:8000"} {
		assert.NotEqual(t, a.Key(u), b.Key(u), u)
		assert.Equal(t, a.Key(u), peers.NewRedis(nil, "t", "c", "node-1", time.Minute).Key(u), "one host: one replica (%s)", u)
	}
	for _, u := range []string{"http://10.0.0.7:8000", "http://vllm-0.vllm.svc:8000", "http://[fd00::7]:8000"} {
		assert.Equal(t, u, a.Key(u))
		assert.Equal(t, a.Key(u), b.Key(u))
	}
}

// TestTenantDemand: a report carries its tenants' demand after each
// replica's, their queued parts after the tenants', names escaped, and
// reads back as sent; a report of a version without tenants reads with
// none.
func TestTenantDemand(t *testing.T) {
	addr := redistest.Start(t)
	ctx := t.Context()
	c := client(t, addr)
	a := peers.NewRedis(c, "t", "a", "h1", time.Minute)
	b := peers.NewRedis(c, "t", "b", "h1", time.Minute)
	sent := []peers.Report{
		{Replica: "http://r1:8000", InFlight: 3, Queued: 2, Tenants: []peers.TenantDemand{
			{Tenant: "acme", Weight: 1, Load: 1500, Claim: 2000, Held: 1000, Steady: true}, {Tenant: "big co/eu:1 @x", Weight: 4, Load: 7000, Claim: 1500, Queued: 500}}},
		{Replica: "http://r2:8000", InFlight: 1},
	}
	_, err := a.Exchange(ctx, sent)
	require.NoError(t, err)
	got, err := b.Exchange(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[string][]peers.Entry{
		"http://r1:8000": {{Instance: "a", InFlight: 3, Queued: 2, Tenants: sent[0].Tenants}},
		"http://r2:8000": {{Instance: "a", InFlight: 1}},
	}, got)

	// What a version that reads only replicas, or replicas and tenants,
	// or those and queued parts, finds: every item three fields with two
	// counts, the tenants', their queued parts and their held parts under
	// keys no replica has, the queued parts after every tenant of their
	// replica and the held parts after those.
	raw, err := c.HGet(ctx, "t:{peers}", "a").Result()
	require.NoError(t, err)
	f := strings.Fields(raw)
	require.Zero(t, (len(f)-1)%3, raw)
	var keys []string
	for i := 1; i < len(f); i += 3 {
		for _, n := range f[i+1 : i+3] {
			v, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err, raw)
			require.GreaterOrEqual(t, v, int64(0))
		}
		keys = append(keys, f[i])
	}
	assert.Equal(t, []string{"http://r1:8000", "@1:acme", "@4:big%20co%2Feu:1%20@x", "!big%20co%2Feu:1%20@x", "^acme", "^big%20co%2Feu:1%20@x", "http://r2:8000"}, keys)

	tm, err := c.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, c.HSet(ctx, "t:{peers}", "old", fmt.Sprintf("%d http://r1:8000 2 5", tm.UnixMilli())).Err())
	got, err = b.Exchange(ctx, nil)
	require.NoError(t, err)
	assert.Contains(t, got["http://r1:8000"], peers.Entry{Instance: "old", InFlight: 2, Queued: 5}, "no tenants: Tenants nil")
	// A version that sends tenants and queued parts but no held parts:
	// each holds its claim but its queued part, so server.reserve_cap
	// binds none of it, and none is steady.
	require.NoError(t, c.HSet(ctx, "t:{peers}", "old", fmt.Sprintf("%d http://r1:8000 2 5 @1:acme 1500 3000 !acme 1000 0", tm.UnixMilli())).Err())
	got, err = b.Exchange(ctx, nil)
	require.NoError(t, err)
	assert.Contains(t, got["http://r1:8000"], peers.Entry{Instance: "old", InFlight: 2, Queued: 5,
		Tenants: []peers.TenantDemand{{Tenant: "acme", Weight: 1, Load: 1500, Claim: 3000, Queued: 1000, Held: 2000}}})
	require.NoError(t, c.HDel(ctx, "t:{peers}", "old").Err())

	for _, bad := range []string{"@1:acme 1 1 http://r1 1 1", "http://r1 1 1 @0:acme 1 1", "http://r1 1 1 @x:acme 1 1", "http://r1 1 1 @1acme 1 1", "http://r1 1 1 @1:a%zz 1 1",
		"!acme 1 0 http://r1 1 1", "http://r1 1 1 !acme 1 0", "http://r1 1 1 @1:acme 1 1 !beta 1 0", "http://r1 1 1 @1:acme 1 1 !acme 2 0", "http://r1 1 1 @1:acme 1 1 !a%zz 1 0",
		"http://r1 1 1 @1:acme 1 1 ^beta 1 0", "http://r1 1 1 @1:acme 1 1 ^acme 2 0", "http://r1 1 1 @1:acme 1 1 ^acme 1 2", "http://r1 1 1 @1:acme 1 1 ^acme 1 0 ^acme 1 0", "^acme 1 0 http://r1 1 1"} {
		require.NoError(t, c.HSet(ctx, "t:{peers}", "bad", fmt.Sprintf("%d %s", tm.UnixMilli(), bad)).Err())
		_, err = b.Exchange(ctx, nil)
		require.ErrorIs(t, err, peers.ErrMalformed, bad)
	}
	_, err = a.Exchange(ctx, []peers.Report{{Replica: "@1:acme"}})
	require.ErrorContains(t, err, "cannot be reported")
	_, err = a.Exchange(ctx, []peers.Report{{Replica: "!acme"}})
	require.ErrorContains(t, err, "cannot be reported")
	_, err = a.Exchange(ctx, []peers.Report{{Replica: "^acme"}})
	require.ErrorContains(t, err, "cannot be reported")
	_, err = a.Exchange(ctx, []peers.Report{{Replica: "http://r1", Tenants: []peers.TenantDemand{{Tenant: "acme", Weight: 1, Claim: 1, Held: 2}}}})
	require.ErrorContains(t, err, "cannot be reported", "more held than claimed")
	_, err = a.Exchange(ctx, []peers.Report{{Replica: "http://r1", Tenants: []peers.TenantDemand{{Tenant: "acme", Weight: 1, Claim: 1, Queued: 2}}}})
	require.ErrorContains(t, err, "cannot be reported", "more queued than claimed")
	_, err = a.Exchange(ctx, []peers.Report{{Replica: "http://r1", Tenants: []peers.TenantDemand{{Tenant: "acme"}}}})
	require.ErrorContains(t, err, "cannot be reported", "weight 0")
}
