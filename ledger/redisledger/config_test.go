package redisledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

func TestOpenValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  redisledger.Config
		want string // substring of the error; "" = no error
	}{
		{name: "defaults", cfg: redisledger.Config{Addrs: []string{"127.0.0.1:1"}}},
		{name: "no_addrs", cfg: redisledger.Config{}, want: "ledger.redis.addrs"},
		{name: "brace_in_prefix", cfg: redisledger.Config{Addrs: []string{"x:1"}, KeyPrefix: "a{b"}, want: "key_prefix"},
		{name: "max_lease_below_lease", cfg: redisledger.Config{Addrs: []string{"x:1"}, LeaseTTL: time.Minute, MaxLeaseTTL: time.Second}, want: "max_lease_ttl"},
		{name: "short_retention", cfg: redisledger.Config{Addrs: []string{"x:1"}, TombstoneRetention: time.Minute}, want: "tombstone_retention"},
		{name: "zero_tenant", cfg: redisledger.Config{Addrs: []string{"x:1"}, Tenants: []ledger.ScopeKey{{}}}, want: "ledger.tenants[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, err := redisledger.Open(tc.cfg)
			if tc.want == "" {
				require.NoError(t, err)
				assert.NoError(t, l.Close())
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestRunReclaimsConfiguredTenants: Run expires a RESERVED lease of a
// configured tenant on its own, and returns nil once its context ends.
func TestRunReclaimsConfiguredTenants(t *testing.T) {
	srv := startRedis(t)
	sc := []ledger.Scope{tenantScope("run", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})}
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) {
		c.Tenants = []ledger.ScopeKey{sc[0].Key}
		c.ReclaimInterval = 10 * time.Millisecond
	})
	ctx, cancel := context.WithCancel(context.Background())
	req := reserveReq(sc, held(40), ledger.NewOwner())
	req.LeaseTTL = 50 * time.Millisecond
	_, err := l.Reserve(ctx, req)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	require.Eventually(t, func() bool {
		u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
		return err == nil && u.Reserved[ledger.Tokens] == 0
	}, 10*time.Second, 10*time.Millisecond, "Run expired the lease")
	cancel()
	require.NoError(t, <-done)
	assert.NoError(t, l.Release(context.Background(), req.Ref, req.Owner), "releasing an EXPIRED record is a no-op")
}

// TestRunReclaimsTenantsItWasNotConfiguredWith: instance
// A reserves for a tenant that instance B's configuration never named (a
// reload added it on A), with a dispatched and a reserved hold, and dies.
// B's Run finds the tenant in the store's registry and reclaims both: the
// RESERVED hold is freed and the DISPATCHED one turns UNRESOLVED, freeing
// its slot.
func TestRunReclaimsTenantsItWasNotConfiguredWith(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	sc := []ledger.Scope{tenantScope("reloaded", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000},
		ledger.Limit{Dim: ledger.Slots, Max: 4})}
	a := newLedger(t, srv.Addr(), nil) // never runs Run: it crashed
	owner := ledger.NewOwner()
	reserved := reserveReq(sc, held(40), owner)
	reserved.LeaseTTL = 50 * time.Millisecond
	dispatched := reserveReq(sc, held(2), owner)
	dispatched.LeaseTTL = 50 * time.Millisecond
	dispatched.Dispatch = true
	for _, r := range []ledger.ReserveRequest{reserved, dispatched} {
		_, err := a.Reserve(ctx, r)
		require.NoError(t, err)
	}
	u, err := a.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	require.Equal(t, int64(42), u.Reserved[ledger.Tokens])
	require.Equal(t, int64(1), u.SlotsInUse)

	b := newLedger(t, srv.Addr(), func(c *redisledger.Config) {
		c.Tenants = []ledger.ScopeKey{testKeyer.Key(ledger.KindTenant, "configured")}
		c.ReclaimInterval = 10 * time.Millisecond
	})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(rctx) }()
	require.Eventually(t, func() bool {
		u, err := b.Snapshot(ctx, sc[0].Key, sc[0].Key)
		return err == nil && u.Reserved[ledger.Tokens] == 2 && u.SlotsInUse == 0 && u.Unresolved == 1
	}, 10*time.Second, 10*time.Millisecond, "B reclaimed the tenant it was never configured with")
	cancel()
	require.NoError(t, <-done)
	list, err := b.List(ctx, sc[0].Key, ledger.Unresolved, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, dispatched.Ref, list[0].Ref)
	assert.NoError(t, b.Release(ctx, reserved.Ref, owner), "the RESERVED one is EXPIRED: releasing it is a no-op")
}
