package redisledger_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// TestInlineGlobal: on one server a global scope lives in the tenant record
// (global.go), so
//   - no hold record is written in the global partition;
//   - a tenant whose own clock is behind the global partition's (here: 2 h;
//     after a failover to a server whose clock is behind, milliseconds)
//     takes the global partition's time, so every tenant charges the one
//     global hash in the same window (before, such a Reserve met a stored
//     window ahead of its own and was refused as corrupt);
//   - a Ledger without batching settles such a record (one script, the
//     global partition's meta key last), and Reclaim of the tenant frees
//     the global hold;
//
// and the global counters end exact.
func TestInlineGlobal(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	single := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.MaxBatch = 1 })
	gkey := testKeyer.GlobalKey()
	gs := ledger.Scope{Kind: ledger.KindGlobal, Key: gkey, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}}
	scopes := func(name string) []ledger.Scope {
		return []ledger.Scope{tenantScope(name, ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}), gs}
	}
	ahead := time.Now().Add(2 * time.Hour)
	a, b, c := scopes("inline-a"), scopes("inline-b"), scopes("inline-c")
	setLedgerTime(t, rc, a[0].Key, ahead)

	ra := reserveReq(a, held(100), ledger.NewOwner())
	_, err := l.Reserve(ctx, ra)
	require.NoError(t, err)
	rb := reserveReq(b, held(200), ledger.NewOwner())
	gb, err := l.Reserve(ctx, rb)
	require.NoError(t, err, "b's clock is behind the global partition's")
	assert.False(t, gb.LeaseExpiry.Before(ahead), "b's lease runs on the global partition's time")
	u, err := l.Snapshot(ctx, gkey, gkey)
	require.NoError(t, err)
	assert.Equal(t, int64(300), u.Reserved[ledger.Tokens])

	keys, err := rc.Keys(ctx, "sluice:{"+gkey.String()+"}:*").Result()
	require.NoError(t, err)
	sort.Strings(keys)
	assert.Equal(t, []string{"sluice:{" + gkey.String() + "}:m", "sluice:{" + gkey.String() + "}:s:" + gkey.String()}, keys,
		"no hold record in the global partition")

	_, err = l.Settle(ctx, ra.Ref, held(60), ledger.SourceFinal)
	require.NoError(t, err)
	s, err := single.Settle(ctx, rb.Ref, held(70), ledger.SourceFinal) // one script, keys from the stored spec
	require.NoError(t, err)
	assert.False(t, s.Replayed)
	s, err = l.Settle(ctx, rb.Ref, held(70), ledger.SourceFinal)
	require.NoError(t, err)
	assert.True(t, s.Replayed, "settled once")

	// A lease that runs out: Reclaim of the tenant frees the global hold too.
	rc2 := reserveReq(c, held(300), ledger.NewOwner())
	rc2.LeaseTTL = time.Second
	_, err = l.Reserve(ctx, rc2)
	require.NoError(t, err)
	setLedgerTime(t, rc, c[0].Key, ahead.Add(10*time.Second))
	st, err := single.Reclaim(ctx, c[0].Key, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Expired)

	u, err = l.Snapshot(ctx, gkey, gkey)
	require.NoError(t, err)
	assert.Equal(t, ledger.Amounts{}, u.Reserved, "every global hold freed")
	require.Len(t, u.Limits, 1)
	assert.Equal(t, int64(60+70), u.Limits[0].Committed, "one window, each Settle charged once")
	ub, err := l.Snapshot(ctx, b[0].Key, b[0].Key)
	require.NoError(t, err)
	assert.Equal(t, int64(70), ub.Limits[0].Committed)
	assert.Zero(t, ub.Reserved[ledger.Tokens])
}
