package ledgertest

import (
	"math/rand/v2"
	"sync"
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
		require.ErrorIs(t, err, ledger.ErrInvalid, "state %s", st)
	}
	got, err := b.Ledger.List(ctx, newKey(1), ledger.Reserved, 10)
	require.NoError(t, err)
	assert.Empty(t, got, "unknown tenant")
	if b.Dump != nil {
		assert.Equal(t, before, b.Dump(tenant), "List writes nothing")
	}
	auditClean(t, b, tenant)
}

func globalScope(key ledger.ScopeKey, limits ...ledger.Limit) ledger.Scope {
	return ledger.Scope{Kind: ledger.KindGlobal, Key: key, Limits: limits}
}

// globalReq is a request of tenant (ample tenant budget unless limits are
// given) against the global scope g.
func globalReq(tenant, g ledger.ScopeKey, h ledger.Amounts, dispatch bool, glim ledger.Limit, limits ...ledger.Limit) ledger.ReserveRequest {
	if len(limits) == 0 {
		limits = []ledger.Limit{lim(ledger.Tokens, time.Hour, 1_000_000)}
	}
	req := simpleReq(tenant, h, dispatch, limits...)
	req.Scopes = append(req.Scopes, globalScope(g, glim))
	return req
}

// frontEnds returns the backend's ledger and its peers.
func frontEnds(b *Backend) []ledger.Ledger { return append([]ledger.Ledger{b.Ledger}, b.Peers...) }

// testGlobal: fleet-wide budgets on top of tenant budgets.
func testGlobal(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	const w = time.Hour
	alignToWindow(b, w, time.Second)
	fes := frontEnds(b)
	globalUsage := func(t *testing.T, g ledger.ScopeKey) ledger.Usage {
		t.Helper()
		return usage(t, b, g, g)
	}

	t.Run("exact admission across tenants and front ends", func(t *testing.T) {
		g := newKey(4)
		glim := lim(ledger.Tokens, w, 1000)
		const tenants, per = 20, 10
		reqs := make([]ledger.ReserveRequest, 0, tenants*per)
		tks := make([]ledger.ScopeKey, tenants)
		for i := range tks {
			tks[i] = newKey(1)
			for range per {
				reqs = append(reqs, globalReq(tks[i], g, tokens(4, 3), false, glim))
			}
		}
		errs := make([]error, len(reqs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() {
				<-start
				_, errs[i] = fes[i%len(fes)].Reserve(ctx, reqs[i])
			})
		}
		close(start)
		wg.Wait()
		var granted []ledger.ReserveRequest
		denied, other := 0, 0
		for i, err := range errs {
			if err == nil {
				granted = append(granted, reqs[i])
				continue
			}
			if d, ok := isDenied(err); ok && d.Scope == ledger.KindGlobal && d.Dim == ledger.Tokens && d.Limit == 1000 && d.Requested == 7 {
				assert.Equal(t, "global", d.Scope.String())
				denied++
				continue
			}
			other++
			t.Errorf("request %d: %s", i, describe(err))
		}
		assert.Len(t, granted, 142, "floor(1000/7) grants")
		assert.Equal(t, 58, denied, "every other request denied on the global budget")
		assert.Equal(t, 0, other)
		gu := globalUsage(t, g)
		assert.Equal(t, int64(994), gu.Reserved[ledger.Tokens], "global r")
		assert.Equal(t, ledger.KindGlobal, gu.Scope)
		// Half settle (actual 3 ≤ h), half release.
		var settledSum int64
		for i, req := range granted {
			fe := fes[i%len(fes)]
			if i%2 == 0 {
				require.NoError(t, fe.MarkDispatched(ctx, req.Ref, req.Owner))
				_, err := fe.Settle(ctx, req.Ref, tokens(2, 1), ledger.SourceFinal)
				require.NoError(t, err)
				settledSum += 3
			} else {
				require.NoError(t, fe.Release(ctx, req.Ref, req.Owner))
			}
		}
		gu = globalUsage(t, g)
		assert.Equal(t, ledger.Amounts{}, gu.Reserved, "global r back to zero")
		assert.Equal(t, settledSum, committed(gu, ledger.Tokens, w), "global c == Σ actual")
		for _, tk := range tks {
			u := usage(t, b, tk, tk)
			assert.Equal(t, ledger.Amounts{}, u.Reserved)
			auditClean(t, b, tk)
		}
		auditClean(t, b, g)
	})

	t.Run("zero false denials with heterogeneous amounts", func(t *testing.T) {
		g := newKey(4)
		const limit = 50_000
		glim := lim(ledger.Tokens, w, limit)
		rng := rand.New(rand.NewPCG(10, 10))
		var reqs []ledger.ReserveRequest
		for range 16 {
			tk := newKey(1)
			for range 8 {
				in := 1 + rng.Int64N(600)
				reqs = append(reqs, globalReq(tk, g, tokens(in, 1+rng.Int64N(400)), false, glim))
			}
		}
		errs := make([]error, len(reqs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() {
				<-start
				_, errs[i] = fes[i%len(fes)].Reserve(ctx, reqs[i])
			})
		}
		close(start)
		wg.Wait()
		var sum int64
		for i, err := range errs {
			if err == nil {
				sum += reqs[i].Held[ledger.Tokens]
			}
		}
		require.LessOrEqual(t, sum, int64(limit), "never over-admit")
		assert.Equal(t, sum, globalUsage(t, g).Reserved[ledger.Tokens], "global r == Σ granted")
		denials, falseDenials := 0, 0
		for i, err := range errs {
			if err == nil {
				continue
			}
			d, ok := isDenied(err)
			require.Truef(t, ok && d.Scope == ledger.KindGlobal, "request %d: %s", i, describe(err))
			denials++
			if limit-sum >= reqs[i].Held[ledger.Tokens] {
				falseDenials++
			}
		}
		assert.Positive(t, denials, "the global budget was short")
		assert.Equal(t, 0, falseDenials, "a global denial with room left at the end is false")
		auditClean(t, b, g)
	})

	t.Run("a tenant denial leaves no global hold", func(t *testing.T) {
		g := newKey(4)
		glim := lim(ledger.Tokens, w, 1000)
		small, other := newKey(1), newKey(1)
		first := globalReq(small, g, tokens(4, 3), false, glim, lim(ledger.Tokens, w, 10))
		_, err := b.Ledger.Reserve(ctx, first)
		require.NoError(t, err)
		second := globalReq(small, g, tokens(4, 3), false, glim, lim(ledger.Tokens, w, 10))
		_, err = b.Ledger.Reserve(ctx, second)
		d, ok := isDenied(err)
		require.Truef(t, ok, "got %s", describe(err))
		assert.Equal(t, ledger.KindTenant, d.Scope)
		slotFull := globalReq(small, g, tokens(1, 0), true, glim, lim(ledger.Tokens, w, 1000), slots(0))
		_, err = b.Ledger.Reserve(ctx, slotFull)
		d, ok = isDenied(err)
		require.Truef(t, ok, "got %s", describe(err))
		assert.Equal(t, ledger.Slots, d.Dim)
		assert.Equal(t, int64(7), globalUsage(t, g).Reserved[ledger.Tokens], "only the granted hold")
		_, err = b.Ledger.Reserve(ctx, globalReq(other, g, tokens(993, 0), false, glim))
		require.NoError(t, err, "no leftover hold causes a false denial")
		_, err = b.Ledger.Reserve(ctx, globalReq(newKey(1), g, tokens(1, 0), false, glim))
		d, ok = isDenied(err)
		require.Truef(t, ok, "got %s", describe(err))
		assert.Equal(t, ledger.DeniedError{Scope: ledger.KindGlobal, Dim: ledger.Tokens, Window: w, Limit: 1000,
			Reserved: 1000, Requested: 1, ResetsAt: d.ResetsAt, RetryAfter: d.RetryAfter}, *d)
		assert.Equal(t, ledger.WindowResetsAt(ledger.WindowIndex(b.Now(), w), w).UnixMilli(), d.ResetsAt.UnixMilli())
		// A retry of the tenant-denied id is evaluated afresh (a denial creates no state).
		require.NoError(t, b.Ledger.Release(ctx, first.Ref, first.Owner))
		_, err = b.Ledger.Reserve(ctx, second)
		require.NoError(t, err)
		assert.Equal(t, int64(1000), globalUsage(t, g).Reserved[ledger.Tokens])
		auditClean(t, b, g)
	})

	t.Run("the id decides before a full global budget", func(t *testing.T) {
		g := newKey(4)
		glim := lim(ledger.Tokens, w, 100)
		tk := newKey(1)
		full := globalReq(tk, g, tokens(100, 0), false, glim)
		first, err := b.Ledger.Reserve(ctx, full)
		require.NoError(t, err)
		for _, fe := range fes {
			again, err := fe.Reserve(ctx, full)
			require.NoError(t, err, "a replay replays although the global budget is full")
			assert.True(t, again.Replayed)
			assert.Equal(t, first.LeaseExpiry.UnixMilli(), again.LeaseExpiry.UnixMilli())
		}
		changed := full
		changed.Held = tokens(99, 0)
		_, err = b.Ledger.Reserve(ctx, changed)
		require.ErrorIs(t, err, ledger.ErrConflict)
		require.NoError(t, b.Ledger.Release(ctx, full.Ref, full.Owner))
		filler := globalReq(newKey(1), g, tokens(100, 0), false, glim)
		_, err = b.Ledger.Reserve(ctx, filler)
		require.NoError(t, err)
		_, err = b.Ledger.Reserve(ctx, full)
		require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		assert.Equal(t, int64(100), globalUsage(t, g).Reserved[ledger.Tokens])
		auditClean(t, b, g)
	})

	t.Run("T2-style: tenant, api_key and global limits overlap", func(t *testing.T) {
		g := newKey(4)
		const gmax = 40_000
		glim := lim(ledger.Tokens, w, gmax)
		rng := rand.New(rand.NewPCG(11, 11))
		type limitRef struct {
			key   ledger.ScopeKey
			limit int64
		}
		var reqs []ledger.ReserveRequest
		var needs [][]limitRef
		for range 8 {
			tk := newKey(1)
			tmax := 3000 + rng.Int64N(6000)
			for k := range 2 {
				ak := newKey(2)
				amax := 2000 + rng.Int64N(3000)
				for range 5 + k {
					h := tokens(1+rng.Int64N(700), 1+rng.Int64N(300))
					req := globalReq(tk, g, h, false, glim, lim(ledger.Tokens, w, tmax))
					req.Scopes = append(req.Scopes, ledger.Scope{Kind: ledger.KindAPIKey, Key: ak, Limits: []ledger.Limit{lim(ledger.Tokens, w, amax)}})
					reqs = append(reqs, req)
					needs = append(needs, []limitRef{{tk, tmax}, {ak, amax}, {g, gmax}})
				}
			}
		}
		errs := make([]error, len(reqs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() {
				<-start
				_, errs[i] = fes[i%len(fes)].Reserve(ctx, reqs[i])
			})
		}
		close(start)
		wg.Wait()
		granted := map[ledger.ScopeKey]int64{}
		for i, err := range errs {
			if err == nil {
				for _, n := range needs[i] {
					granted[n.key] += reqs[i].Held[ledger.Tokens]
				}
			}
		}
		maxOf := map[ledger.ScopeKey]int64{}
		for _, ns := range needs {
			for _, n := range ns {
				maxOf[n.key] = n.limit
			}
		}
		for key, limit := range maxOf {
			require.LessOrEqual(t, granted[key], limit, "never over-admit")
			tenant := key
			if key != g {
				tenant = reqs[0].Ref.Tenant
				for i := range reqs {
					for _, n := range needs[i] {
						if n.key == key {
							tenant = reqs[i].Ref.Tenant
						}
					}
				}
			}
			assert.Equal(t, granted[key], usage(t, b, tenant, key).Reserved[ledger.Tokens], "r == Σ granted")
		}
		falseTenant, falseGlobal, denials := 0, 0, 0
		for i, err := range errs {
			if err == nil {
				continue
			}
			d, ok := isDenied(err)
			require.Truef(t, ok, "request %d: %s", i, describe(err))
			denials++
			fits := true
			for _, n := range needs[i] {
				fits = fits && n.limit-granted[n.key] >= reqs[i].Held[ledger.Tokens]
			}
			if fits {
				if d.Scope == ledger.KindGlobal {
					falseGlobal++
				} else {
					falseTenant++
				}
			}
		}
		assert.Positive(t, denials)
		assert.Equal(t, 0, falseTenant, "a tenant or api_key denial with room left at the end is false")
		if b.AtomicGlobal {
			assert.Equal(t, 0, falseGlobal, "atomic global admission never denies falsely")
		} else {
			t.Logf("global denials that would have fit at the end: %d of %d denials (two-step window)", falseGlobal, denials)
		}
		auditClean(t, b, g)
	})

	t.Run("every resolution reaches the global hold once", func(t *testing.T) {
		g := newKey(4)
		glim := lim(ledger.Tokens, w, 100_000)
		tk := newKey(1)
		reclaim := func() {
			t.Helper()
			_, err := b.Ledger.Reclaim(ctx, tk, 100)
			require.NoError(t, err)
			_, err = b.Ledger.Reclaim(ctx, g, 100)
			require.NoError(t, err)
		}
		// Dispatch, extend, settle; a replayed settle changes nothing.
		a := globalReq(tk, g, tokens(10, 10), false, glim)
		gr, err := b.Ledger.Reserve(ctx, a)
		require.NoError(t, err)
		assert.Equal(t, int64(100_000-20), gr.Headroom[ledger.Tokens].Remaining, "the global room is the tightest")
		require.NoError(t, b.Ledger.MarkDispatched(ctx, a.Ref, a.Owner))
		_, err = b.Ledger.Extend(ctx, a.Ref, a.Owner, 90*time.Second)
		require.NoError(t, err)
		_, err = b.Ledger.Settle(ctx, a.Ref, tokens(5, 3), ledger.SourceFinal)
		require.NoError(t, err)
		s, err := b.Ledger.Settle(ctx, a.Ref, tokens(5, 3), ledger.SourceFinal)
		require.NoError(t, err)
		assert.True(t, s.Replayed)
		// Released before dispatch.
		rel := globalReq(tk, g, tokens(7, 0), false, glim)
		_, err = b.Ledger.Reserve(ctx, rel)
		require.NoError(t, err)
		require.NoError(t, b.Ledger.Release(ctx, rel.Ref, rel.Owner))
		// Expired before dispatch; dispatched then lost (UNRESOLVED), then resolved.
		exp := globalReq(tk, g, tokens(30, 0), false, glim)
		exp.LeaseTTL = time.Second
		_, err = b.Ledger.Reserve(ctx, exp)
		require.NoError(t, err)
		lost := globalReq(tk, g, tokens(40, 2), true, glim)
		lost.LeaseTTL = time.Second
		_, err = b.Ledger.Reserve(ctx, lost)
		require.NoError(t, err)
		assert.Equal(t, int64(72), globalUsage(t, g).Reserved[ledger.Tokens])
		b.Advance(2 * time.Second)
		reclaim()
		assert.Equal(t, int64(42), globalUsage(t, g).Reserved[ledger.Tokens], "expired hold freed, unresolved one kept")
		s, err = b.Ledger.Resolve(ctx, lost.Ref)
		require.NoError(t, err)
		assert.Equal(t, ledger.Charged, s.State)
		reclaim()
		_, err = b.Ledger.Resolve(ctx, lost.Ref)
		require.NoError(t, err, "replayed resolve")
		gu := globalUsage(t, g)
		assert.Equal(t, ledger.Amounts{}, gu.Reserved, "global r back to zero")
		assert.Equal(t, int64(8+42), committed(gu, ledger.Tokens, w), "global c: one settle and one charge at the hold")
		assert.Equal(t, int64(8+42), committed(usage(t, b, tk, tk), ledger.Tokens, time.Hour), "tenant c agrees")
		auditClean(t, b, tk)
		auditClean(t, b, g)
	})

	t.Run("policy", func(t *testing.T) {
		g := newKey(4)
		req := globalReq(newKey(1), g, tokens(1, 0), false, slots(3))
		_, err := b.Ledger.Reserve(ctx, req)
		require.ErrorIs(t, err, ledger.ErrPolicy, "no slots limit on a global scope")
		req = globalReq(newKey(1), g, tokens(1, 0), false, lim(ledger.Tokens, w, 10))
		req.Scopes = append(req.Scopes, globalScope(newKey(4), lim(ledger.Tokens, w, 10)))
		_, err = b.Ledger.Reserve(ctx, req)
		assert.ErrorIs(t, err, ledger.ErrInvalid, "two global scopes")
	})
}

func chargeReq(tenant ledger.ScopeKey, a ledger.Amounts, at time.Time, limits ...ledger.Limit) ledger.ChargeRequest {
	return ledger.ChargeRequest{Ref: ledger.Ref{Tenant: tenant, ID: ledger.NewRequestID()},
		Scopes: []ledger.Scope{tenantScope(tenant, limits...)}, Amounts: a, At: at}
}

// testCharge: usage admitted during a ledger outage is committed exactly
// once, in the window it was used in if that window is still current, and
// never denied.
func testCharge(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	const day = 24 * time.Hour
	// 02:10 UTC: the 1h window began 10 min ago, the 24h window 2h10m ago.
	alignToWindow(b, day, 2*time.Hour+10*time.Minute)
	limits := []ledger.Limit{lim(ledger.Tokens, time.Hour, 1000), lim(ledger.Tokens, day, 100_000)}
	fes := frontEnds(b)

	t.Run("exactly once under concurrent replay", func(t *testing.T) {
		tenant := newKey(1)
		req := chargeReq(tenant, tokens(30, 12), b.Now().Add(-time.Minute), limits...)
		const n = 40
		res := make([]ledger.Settlement, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				res[i], errs[i] = fes[i%len(fes)].Charge(ctx, req)
			})
		}
		close(start)
		wg.Wait()
		fresh := 0
		for i := range n {
			require.NoError(t, errs[i])
			assert.Equal(t, req.Amounts, res[i].Charged)
			assert.Equal(t, ledger.Settled, res[i].State)
			if !res[i].Replayed {
				fresh++
			}
		}
		assert.Equal(t, 1, fresh, "one charge applied, the rest replayed")
		u := usage(t, b, tenant, tenant)
		assert.Equal(t, int64(42), committed(u, ledger.Tokens, time.Hour))
		assert.Equal(t, int64(42), committed(u, ledger.Tokens, day))
		assert.Equal(t, ledger.Amounts{}, u.Reserved, "a charge holds nothing")
		var before string
		if b.Dump != nil {
			before = b.Dump(tenant)
		}
		changed := req
		changed.Amounts = tokens(30, 13)
		_, err := b.Ledger.Charge(ctx, changed)
		require.ErrorIs(t, err, ledger.ErrConflict, "same id, different amount")
		if b.Dump != nil {
			assert.Equal(t, before, b.Dump(tenant), "a conflicting charge changes nothing")
		}
		s, err := b.Ledger.Settle(ctx, req.Ref, req.Amounts, ledger.SourceFinal)
		require.NoError(t, err)
		assert.True(t, s.Replayed, "a Settle with the same actual is a replay")
		_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, tokens(1, 0), false, limits...))
		require.NoError(t, err)
		auditClean(t, b, tenant)
	})

	t.Run("window placement", func(t *testing.T) {
		now := b.Now()
		tests := []struct {
			name         string
			at           time.Time
			hour, dayWin int64
		}{
			{"current hour and day", now.Add(-5 * time.Minute), 8, 8},
			{"closed hour, current day", now.Add(-20 * time.Minute), 0, 8},
			{"closed day", now.Add(-3 * time.Hour), 0, 0},
			{"future counts as now", now.Add(time.Hour), 8, 8},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				tenant := newKey(1)
				s, err := b.Ledger.Charge(ctx, chargeReq(tenant, tokens(5, 3), tc.at, limits...))
				require.NoError(t, err)
				assert.Equal(t, ledger.Settlement{State: ledger.Settled, Charged: tokens(5, 3)}, s,
					"charged (to the usage log at least) even when its window has closed")
				u := usage(t, b, tenant, tenant)
				assert.Equal(t, tc.hour, committed(u, ledger.Tokens, time.Hour))
				assert.Equal(t, tc.dayWin, committed(u, ledger.Tokens, day))
				auditClean(t, b, tenant)
			})
		}
	})

	t.Run("never denied, reported, and conserves holds", func(t *testing.T) {
		tenant := newKey(1)
		hold := simpleReq(tenant, tokens(100, 0), false, limits...)
		_, err := b.Ledger.Reserve(ctx, hold)
		require.NoError(t, err)
		s, err := b.Ledger.Charge(ctx, chargeReq(tenant, tokens(850, 0), b.Now(), limits...))
		require.NoError(t, err)
		assert.False(t, s.OverLimit, "950 of 1000")
		s, err = b.Ledger.Charge(ctx, chargeReq(tenant, tokens(100, 0), b.Now(), limits...))
		require.NoError(t, err, "a charge is never denied")
		assert.True(t, s.OverLimit, "c + r = 1050 > 1000 is reported")
		u := usage(t, b, tenant, tenant)
		assert.Equal(t, int64(950), committed(u, ledger.Tokens, time.Hour))
		assert.Equal(t, int64(100), u.Reserved[ledger.Tokens], "the hold is untouched")
		_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, tokens(1, 0), false, limits...))
		_, denied := isDenied(err)
		assert.True(t, denied, "the overdrawn budget denies new work, got %s", describe(err))
		require.NoError(t, b.Ledger.Release(ctx, hold.Ref, hold.Owner))
		u = usage(t, b, tenant, tenant)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Equal(t, int64(950), committed(u, ledger.Tokens, time.Hour))
		auditClean(t, b, tenant)
	})

	t.Run("global scope", func(t *testing.T) {
		tenant, g := newKey(1), newKey(4)
		req := chargeReq(tenant, tokens(6, 1), b.Now(), limits...)
		req.Scopes = append(req.Scopes, globalScope(g, lim(ledger.Tokens, time.Hour, 5)))
		s, err := b.Ledger.Charge(ctx, req)
		require.NoError(t, err)
		assert.True(t, s.OverLimit, "7 > global 5")
		s, err = b.Ledger.Charge(ctx, req)
		require.NoError(t, err)
		assert.True(t, s.Replayed)
		assert.Equal(t, int64(7), committed(usage(t, b, g, g), ledger.Tokens, time.Hour), "global c once")
		assert.Equal(t, int64(7), committed(usage(t, b, tenant, tenant), ledger.Tokens, time.Hour))
		auditClean(t, b, g)
	})

	t.Run("refusals", func(t *testing.T) {
		tenant := newKey(1)
		r := simpleReq(tenant, tokens(1, 0), false, limits...)
		_, err := b.Ledger.Reserve(ctx, r)
		require.NoError(t, err)
		c := chargeReq(tenant, tokens(1, 0), b.Now(), limits...)
		c.Ref = r.Ref
		_, err = b.Ledger.Charge(ctx, c)
		require.ErrorIs(t, err, ledger.ErrConflict, "the id names a reservation")
		c = chargeReq(tenant, tokens(1, 0), time.Time{}, limits...)
		_, err = b.Ledger.Charge(ctx, c)
		require.ErrorIs(t, err, ledger.ErrInvalid, "no usage time")
		c = chargeReq(tenant, tokens(1, 0), b.Now(), limits...)
		c.Scopes[0].Key = newKey(1)
		_, err = b.Ledger.Charge(ctx, c)
		require.ErrorIs(t, err, ledger.ErrInvalid, "tenant scope must be Ref.Tenant")
		c = chargeReq(tenant, ledger.Amounts{ledger.Tokens: 5}, b.Now(), limits...)
		_, err = b.Ledger.Charge(ctx, c)
		assert.ErrorIs(t, err, ledger.ErrInvalid, "tokens != input + output")
	})
}

// testExtensionsRestart: global holds and charges survive a crash and
// restart (Memory: journal replay and compaction snapshots).
func testExtensionsRestart(t *testing.T, f Factory) {
	cfg := DefaultConfig()
	cfg.Durable = true
	b := f(t, cfg)
	if b.Restart == nil {
		t.Skip("backend has no Restart")
	}
	ctx := t.Context()
	const w = time.Hour
	alignToWindow(b, w, time.Second)
	tenant, g := newKey(1), newKey(4)
	glim := lim(ledger.Tokens, w, 1000)
	run := globalReq(tenant, g, tokens(15, 5), true, glim)
	_, err := b.Ledger.Reserve(ctx, run)
	require.NoError(t, err)
	idle := globalReq(tenant, g, tokens(5, 0), false, glim)
	_, err = b.Ledger.Reserve(ctx, idle)
	require.NoError(t, err)
	ch := chargeReq(tenant, tokens(4, 3), b.Now(), lim(ledger.Tokens, w, 1_000_000))
	ch.Scopes = append(ch.Scopes, globalScope(g, glim))
	_, err = b.Ledger.Charge(ctx, ch)
	require.NoError(t, err)
	for i := range 3 {
		l, err := b.Restart()
		require.NoError(t, err, "restart %d", i)
		b.Ledger = l
		gu := usage(t, b, g, g)
		assert.Equal(t, int64(20), gu.Reserved[ledger.Tokens], "restart %d: the dispatched hold is UNRESOLVED and kept, the reserved one EXPIRED", i)
		assert.Equal(t, int64(7), committed(gu, ledger.Tokens, w), "restart %d: global c", i)
		assert.Equal(t, int64(7), committed(usage(t, b, tenant, tenant), ledger.Tokens, w))
		s, err := b.Ledger.Charge(ctx, ch)
		require.NoError(t, err)
		assert.True(t, s.Replayed, "restart %d: the charge answers replays", i)
		auditClean(t, b, tenant)
		auditClean(t, b, g)
	}
	_, err = b.Ledger.Settle(ctx, run.Ref, tokens(10, 2), ledger.SourcePartial)
	require.NoError(t, err)
	gu := usage(t, b, g, g)
	assert.Equal(t, ledger.Amounts{}, gu.Reserved)
	assert.Equal(t, int64(19), committed(gu, ledger.Tokens, w))
	auditClean(t, b, g)
}
