package ledgertest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// testSameAttempt: a Reserve repeated with the same Attempt (a retry after a
// lost reply) answers the original grant as a success; a
// different Attempt is Replayed with the record's State; a terminal record
// answers a *ledger.FinalError naming its state. Holds are taken once.
func testSameAttempt(t *testing.T, f Factory) {
	cfg := DefaultConfig()
	cfg.Durable = true
	b := f(t, cfg)
	ctx := t.Context()
	alignToWindow(b, time.Hour, time.Second)
	l := b.Ledger
	tenant := newKey(1)
	req := simpleReq(tenant, tokens(5, 2), false, lim(ledger.Tokens, time.Hour, 1000), slots(4))
	req.Attempt = 0x5eed
	first, err := l.Reserve(ctx, req)
	require.NoError(t, err)
	require.False(t, first.Replayed)

	check := func(l ledger.Ledger, attempt uint64, wantReplayed bool, wantState ledger.State) {
		t.Helper()
		r := req
		r.Attempt = attempt
		g, err := l.Reserve(ctx, r)
		require.NoError(t, err)
		assert.Equal(t, wantReplayed, g.Replayed, "attempt %x", attempt)
		assert.Equal(t, wantState, g.State)
		assert.Equal(t, req.Owner, g.Owner)
		assert.Equal(t, ms(first.LeaseExpiry), ms(g.LeaseExpiry), "the original lease")
	}
	check(l, req.Attempt, false, ledger.Reserved)
	check(l, req.Attempt, false, ledger.Reserved)
	check(l, 0x0bad, true, ledger.Reserved)
	check(l, 0, true, ledger.Reserved)
	for _, p := range b.Peers {
		check(p, req.Attempt, false, ledger.Reserved) // the retry may come back through another connection
		check(p, 7, true, ledger.Reserved)
	}
	assert.Equal(t, int64(7), usage(t, b, tenant, tenant).Reserved[ledger.Tokens], "held once")

	conflict := req
	conflict.Held = tokens(5, 3)
	_, err = l.Reserve(ctx, conflict)
	require.ErrorIs(t, err, ledger.ErrConflict, "same attempt, other payload")

	require.NoError(t, l.MarkDispatched(ctx, req.Ref, req.Owner))
	check(l, req.Attempt, false, ledger.Dispatched)
	check(l, 9, true, ledger.Dispatched)
	u := usage(t, b, tenant, tenant)
	assert.Equal(t, int64(7), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(1), u.SlotsInUse)

	if b.Restart != nil {
		var err error
		l, err = b.Restart()
		require.NoError(t, err)
		check(l, req.Attempt, false, ledger.Unresolved) // the nonce survives a restart
		check(l, 9, true, ledger.Unresolved)
		_, err = l.Resolve(ctx, req.Ref)
		require.NoError(t, err)
	} else {
		_, err = l.Settle(ctx, req.Ref, tokens(5, 1), ledger.SourceFinal)
		require.NoError(t, err)
	}
	want := ledger.Settled
	if b.Restart != nil {
		want = ledger.Charged
	}
	for _, attempt := range []uint64{req.Attempt, 9} {
		r := req
		r.Attempt = attempt
		_, err = l.Reserve(ctx, r)
		var fe *ledger.FinalError
		require.ErrorAs(t, err, &fe, "final: %v", err)
		require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		assert.Equal(t, want, fe.State)
	}

	// A first attempt that never ran: the record says RELEASED.
	rel := simpleReq(tenant, tokens(1, 1), false, lim(ledger.Tokens, time.Hour, 1000))
	rel.Attempt = 1
	_, err = l.Reserve(ctx, rel)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx, rel.Ref, rel.Owner))
	rel.Attempt = 2
	_, err = l.Reserve(ctx, rel)
	var fe *ledger.FinalError
	require.ErrorAs(t, err, &fe, "final: %v", err)
	assert.Equal(t, ledger.Released, fe.State)

	// With a global scope: the same attempt takes the global hold once.
	g := newKey(4)
	greq := globalReq(newKey(1), g, tokens(4, 3), false, lim(ledger.Tokens, time.Hour, 100))
	greq.Attempt = 0xabc
	for i := range 3 {
		gr, err := l.Reserve(ctx, greq)
		require.NoError(t, err)
		assert.False(t, gr.Replayed, "try %d", i)
	}
	greq.Attempt = 0xdef
	gr, err := l.Reserve(ctx, greq)
	require.NoError(t, err)
	assert.True(t, gr.Replayed)
	gu, err := l.Snapshot(ctx, g, g)
	require.NoError(t, err)
	assert.Equal(t, int64(7), gu.Reserved[ledger.Tokens], "global hold taken once")
}
