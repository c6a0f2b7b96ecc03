package ledgertest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// Tests of the issue-10 extensions: List (admin API), global budgets and
// Charge. They are registered in Run.

// testList: List returns exactly the open records of one state, ordered by
// lease expiry (UNRESOLVED: chargeable-at), with their exact fields, and
// writes nothing.
func testList(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	const w = 24 * time.Hour
	alignToWindow(b, w, time.Second)
	tenant := newKey(1)
	limits := []ledger.Limit{lim(ledger.Tokens, w, 1_000_000)}
	reserve := func(h ledger.Amounts, dispatch bool, ttl time.Duration, owner byte) ledger.ReservationInfo {
		t.Helper()
		req := simpleReq(tenant, h, dispatch, limits...)
		req.LeaseTTL, req.Owner = ttl, ledger.Owner{owner}
		g, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		st := ledger.Reserved
		if dispatch {
			st = ledger.Dispatched
		}
		return ledger.ReservationInfo{Ref: req.Ref, State: st, Held: h, LeaseExpiry: g.LeaseExpiry.UTC(),
			AdmittedAt: b.Now().Truncate(time.Millisecond).UTC(), Owner: req.Owner}
	}
	unres := reserve(tokens(1, 2), true, 10*time.Second, 7)
	b.Advance(11 * time.Second)
	_, err := b.Ledger.Reclaim(ctx, tenant, 10)
	require.NoError(t, err)
	unres.State = ledger.Unresolved
	r30 := reserve(tokens(3, 0), false, 30*time.Second, 1)
	r20 := reserve(tokens(2, 0), false, 20*time.Second, 2)
	r40 := reserve(tokens(4, 0), false, 40*time.Second, 3)
	d50 := reserve(tokens(5, 5), true, 50*time.Second, 4)
	d45 := reserve(tokens(4, 5), true, 45*time.Second, 5)
	gone := reserve(tokens(9, 0), false, 15*time.Second, 1)
	require.NoError(t, b.Ledger.Release(ctx, gone.Ref, gone.Owner))
	settled := reserve(tokens(9, 0), true, 15*time.Second, 1)
	_, err = b.Ledger.Settle(ctx, settled.Ref, tokens(1, 0), ledger.SourceFinal)
	require.NoError(t, err)

	var before string
	if b.Dump != nil {
		before = b.Dump(tenant)
	}
	tests := []struct {
		name  string
		state ledger.State
		max   int
		want  []ledger.ReservationInfo
	}{
		{"reserved by lease expiry", ledger.Reserved, 0, []ledger.ReservationInfo{r20, r30, r40}},
		{"reserved, max 2", ledger.Reserved, 2, []ledger.ReservationInfo{r20, r30}},
		{"dispatched", ledger.Dispatched, 10, []ledger.ReservationInfo{d45, d50}},
		{"unresolved", ledger.Unresolved, 10, []ledger.ReservationInfo{unres}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.Ledger.List(ctx, tenant, tc.state, tc.max)
			require.NoError(t, err)
			for i := range got {
				got[i].LeaseExpiry, got[i].AdmittedAt = got[i].LeaseExpiry.UTC(), got[i].AdmittedAt.UTC()
			}
			assert.Equal(t, tc.want, got)
		})
	}
	for _, st := range []ledger.State{ledger.Settled, ledger.Released, ledger.Charged, 0, 99} {
		_, err := b.Ledger.List(ctx, tenant, st, 10)
		assert.ErrorIs(t, err, ledger.ErrInvalid, "state %s", st)
	}
	got, err := b.Ledger.List(ctx, newKey(1), ledger.Reserved, 10)
	require.NoError(t, err)
	assert.Empty(t, got, "unknown tenant")
	if b.Dump != nil {
		assert.Equal(t, before, b.Dump(tenant), "List writes nothing")
	}
	auditClean(t, b, tenant)
}
