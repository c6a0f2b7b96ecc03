package redisledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// TestT14LedgerTimeNeverDecreases: with the tenant's hwm 60 s ahead of the
// server's TIME (as after a failover to a replica whose clock is behind),
// ledger time, lease expiries and window indices follow the hwm, never TIME,
// and never go back. Front ends send only durations, so their own clock skew
// cannot enter.
func TestT14LedgerTimeNeverDecreases(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	sc := []ledger.Scope{tenantScope("t14", ledger.Limit{Dim: ledger.Tokens, Window: time.Minute, Max: 1 << 30})}
	owner := ledger.NewOwner()
	// Create the tenant, then move its hwm 60 s ahead of TIME.
	_, err := l.Reserve(ctx, reserveReq(sc, held(1), owner))
	require.NoError(t, err)
	ahead := time.Now().Add(60 * time.Second).Truncate(time.Millisecond)
	setLedgerTime(t, rc, sc[0].Key, ahead)

	var last time.Time
	for i := range 20 {
		req := reserveReq(sc, held(1), owner)
		req.LeaseTTL = 10 * time.Second
		g, err := l.Reserve(ctx, req)
		require.NoError(t, err)
		u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
		require.NoError(t, err)
		assert.False(t, u.Now.Before(ahead), "call %d: ledger time %s before hwm %s", i, u.Now, ahead)
		assert.False(t, u.Now.Before(last), "call %d: ledger time went back", i)
		assert.Equal(t, u.Now.Add(10*time.Second), g.LeaseExpiry, "call %d: the lease runs from ledger time", i)
		require.Len(t, u.Limits, 1)
		assert.Equal(t, ledger.WindowResetsAt(ledger.WindowIndex(ahead, time.Minute), time.Minute), u.Limits[0].ResetsAt,
			"call %d: the window follows ledger time", i)
		last = u.Now
	}
}
