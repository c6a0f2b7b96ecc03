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
