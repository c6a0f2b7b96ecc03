package redisledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

var testKeyer, _ = ledger.NewKeyer([]byte("sluice-test-id-key-0123456789"))

// newLedger opens a Ledger on srv (or on addr when given) with test defaults.
func newLedger(t testing.TB, addr string, mod func(*redisledger.Config)) *redisledger.Ledger {
	t.Helper()
	return newLedgerAt(t, []string{addr}, mod)
}

// newLedgerAt is newLedger on the store at addrs (several: a Cluster).
func newLedgerAt(t testing.TB, addrs []string, mod func(*redisledger.Config)) *redisledger.Ledger {
	t.Helper()
	// StoreTimeout is generous: these tests check semantics on 2 shared cores
	// under -race; the timeout tests (T9, T10) set their own.
	cfg := redisledger.Config{Addrs: addrs, LeaseTTL: 10 * time.Second, TombstoneRetention: time.Hour,
		StoreTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	l, err := redisledger.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func tenantScope(name string, limits ...ledger.Limit) ledger.Scope {
	return ledger.Scope{Kind: ledger.KindTenant, Key: testKeyer.Key(ledger.KindTenant, name), Limits: limits}
}

func held(tokens int64) ledger.Amounts {
	var a ledger.Amounts
	a[ledger.Requests] = 1
	a[ledger.InputTokens] = tokens
	a[ledger.Tokens] = tokens
	return a
}

func reserveReq(sc []ledger.Scope, h ledger.Amounts, owner ledger.Owner) ledger.ReserveRequest {
	return ledger.ReserveRequest{
		Ref:    ledger.Ref{Tenant: sc[0].Key, ID: ledger.NewRequestID()},
		Owner:  owner,
		Scopes: sc,
		Held:   h,
	}
}

func TestBasicLifecycle(t *testing.T) {
	srv := startRedis(t)
	l := newLedger(t, srv.Addr(), nil)
	ctx := context.Background()
	owner := ledger.NewOwner()
	sc := []ledger.Scope{tenantScope("acme",
		ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 100},
		ledger.Limit{Dim: ledger.Slots, Max: 1})}

	r1 := reserveReq(sc, held(60), owner)
	g, err := l.Reserve(ctx, r1)
	require.NoError(t, err)
	assert.Equal(t, ledger.Reserved, g.State)
	assert.Equal(t, int64(40), g.Headroom[ledger.Tokens].Remaining)
	assert.Equal(t, int64(1), g.Headroom[ledger.Slots].Remaining)

	g2, err := l.Reserve(ctx, r1)
	require.NoError(t, err)
	assert.True(t, g2.Replayed)
	assert.Equal(t, g.LeaseExpiry, g2.LeaseExpiry)

	r2 := reserveReq(sc, held(41), owner)
	_, err = l.Reserve(ctx, r2)
	var de *ledger.DeniedError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, ledger.Tokens, de.Dim)
	assert.Equal(t, int64(60), de.Reserved)
	assert.Equal(t, int64(41), de.Requested)
	assert.Equal(t, ledger.KindTenant, de.Scope)

	require.NoError(t, l.MarkDispatched(ctx, r1.Ref, owner))
	r3 := reserveReq(sc, held(10), owner)
	_, err = l.Reserve(ctx, r3)
	require.NoError(t, err)
	err = l.MarkDispatched(ctx, r3.Ref, owner)
	require.ErrorAs(t, err, &de)
	assert.Equal(t, ledger.Slots, de.Dim)

	u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	assert.Equal(t, int64(70), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(1), u.SlotsInUse)

	s, err := l.Settle(ctx, r1.Ref, held(50), ledger.SourceFinal)
	require.NoError(t, err)
	assert.Equal(t, ledger.Settled, s.State)
	assert.False(t, s.Replayed)
	s, err = l.Settle(ctx, r1.Ref, held(50), ledger.SourceFinal)
	require.NoError(t, err)
	assert.True(t, s.Replayed)
	_, err = l.Settle(ctx, r1.Ref, held(51), ledger.SourceFinal)
	require.ErrorIs(t, err, ledger.ErrConflict)

	require.NoError(t, l.Release(ctx, r3.Ref, owner))
	u, err = l.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(0), u.SlotsInUse)
	require.Len(t, u.Limits, 2)
	assert.Equal(t, int64(50), u.Limits[0].Committed)
	assert.Equal(t, int64(50), u.Limits[0].Remaining)

	_, err = l.Reserve(ctx, r3)
	require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
	_ = errors.Is
	_ = redis.Nil
}

// TestUnixSocket: an address that starts with "/" is the server's Unix
// socket (docs/configuration.md, `ledger.redis.addrs`), with the same semantics.
func TestUnixSocket(t *testing.T) {
	srv := startRedisUnix(t)
	l := newLedger(t, srv.Sock(), nil)
	ctx := context.Background()
	sc := []ledger.Scope{tenantScope("unix", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})}
	req := reserveReq(sc, held(100), ledger.NewOwner())
	_, err := l.Reserve(ctx, req)
	require.NoError(t, err)
	_, err = l.Settle(ctx, req.Ref, held(40), ledger.SourceFinal)
	require.NoError(t, err)
	u, err := newLedger(t, srv.Addr(), nil).Snapshot(ctx, sc[0].Key, sc[0].Key) // the same server over TCP
	require.NoError(t, err)
	assert.Equal(t, int64(40), u.Limits[0].Committed)
}
