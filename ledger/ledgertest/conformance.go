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

// alignToWindow advances ledger time to offset after the next multiple of w.
func alignToWindow(b *Backend, w, offset time.Duration) {
	now := b.Now()
	next := ledger.WindowResetsAt(ledger.WindowIndex(now, w), w)
	b.Advance(next.Sub(now) + offset)
}

// T2: heterogeneous amounts over overlapping limits, reserve-only rounds.
func testHeterogeneous(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	const w = time.Hour
	alignToWindow(b, w, time.Second)
	rng := rand.New(rand.NewPCG(2, 2))
	for round := range 4 {
		tenant := newKey(1)
		keys := make([]ledger.ScopeKey, 4)
		wfs := make([]ledger.ScopeKey, 8)
		for i := range keys {
			keys[i] = newKey(2)
		}
		for i := range wfs {
			wfs[i] = newKey(3)
		}
		const tenantMax, keyMax, wfMax = 30000, 9000, 5000
		type call struct {
			req   ledger.ReserveRequest
			err   error
			scope [3]ledger.ScopeKey
		}
		calls := make([]call, 160)
		for i := range calls {
			amt := rng.Int64N(1000) + 1
			k, wf := keys[rng.IntN(len(keys))], wfs[rng.IntN(len(wfs))]
			calls[i].scope = [3]ledger.ScopeKey{tenant, k, wf}
			calls[i].req = ledger.ReserveRequest{
				Ref:   ledger.Ref{Tenant: tenant, ID: ledger.NewRequestID()},
				Owner: ledger.Owner{1},
				Scopes: []ledger.Scope{
					tenantScope(tenant, lim(ledger.Tokens, w, tenantMax)),
					{Kind: ledger.KindAPIKey, Key: k, Limits: []ledger.Limit{lim(ledger.Tokens, w, keyMax)}},
					{Kind: ledger.KindWorkflow, Key: wf, Limits: []ledger.Limit{lim(ledger.Tokens, w, wfMax)}},
				},
				Held: tokens(amt, 0),
			}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range calls {
			wg.Go(func() {
				<-start
				_, calls[i].err = b.Ledger.Reserve(ctx, calls[i].req)
			})
		}
		close(start)
		wg.Wait()
		granted := map[ledger.ScopeKey]int64{}
		for _, c := range calls {
			if c.err == nil {
				for _, s := range c.scope {
					granted[s] += c.req.Held[ledger.Tokens]
				}
				continue
			}
			_, ok := isDenied(c.err)
			require.Truef(t, ok, "round %d: only denials expected, got %v", round, c.err)
		}
		room := map[ledger.ScopeKey]int64{}
		for s, max := range map[*[]ledger.ScopeKey]int64{{tenant}: tenantMax, &keys: keyMax, &wfs: wfMax} {
			for _, k := range *s {
				u := usage(t, b, tenant, k)
				assert.Equalf(t, granted[k], u.Reserved[ledger.Tokens], "round %d: server r == Σ granted", round)
				assert.LessOrEqualf(t, granted[k], max, "round %d: Σ granted ≤ max", round)
				room[k] = max - u.Reserved[ledger.Tokens]
			}
		}
		falseDenials := 0
		for _, c := range calls {
			if c.err == nil {
				continue
			}
			fits := true
			for _, s := range c.scope {
				fits = fits && room[s] >= c.req.Held[ledger.Tokens]
			}
			if fits {
				falseDenials++
			}
			err := b.Ledger.MarkDispatched(ctx, c.req.Ref, c.req.Owner)
			require.ErrorIsf(t, err, ledger.ErrNotFound, "a denied id leaves no record")
		}
		assert.Zerof(t, falseDenials, "round %d: false denials", round)
		auditClean(t, b, tenant)
	}
}

func simpleReq(tenant ledger.ScopeKey, h ledger.Amounts, dispatch bool, limits ...ledger.Limit) ledger.ReserveRequest {
	return ledger.ReserveRequest{Ref: ledger.Ref{Tenant: tenant, ID: ledger.NewRequestID()}, Owner: ledger.Owner{1},
		Scopes: []ledger.Scope{tenantScope(tenant, limits...)}, Held: h, Dispatch: dispatch}
}

// T3: duplicate Reserve from many goroutines, then a changed payload.
func testDuplicateReserve(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	alignToWindow(b, time.Hour, time.Second)
	tenant := newKey(1)
	req := simpleReq(tenant, tokens(5, 2), false, lim(ledger.Tokens, time.Hour, 1000))
	grants := make([]ledger.Grant, 100)
	errs := make([]error, 100)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range grants {
		wg.Go(func() {
			<-start
			grants[i], errs[i] = b.Ledger.Reserve(ctx, req)
		})
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i := range grants {
		require.NoError(t, errs[i])
		if !grants[i].Replayed {
			fresh++
		}
		assert.Equal(t, ms(grants[0].LeaseExpiry), ms(grants[i].LeaseExpiry), "same lease expiry")
		assert.Equal(t, req.Owner, grants[i].Owner)
	}
	assert.Equal(t, 1, fresh, "exactly one grant without Replayed")
	assert.Equal(t, int64(7), usage(t, b, tenant, tenant).Reserved[ledger.Tokens], "r += h once")
	var before string
	if b.Dump != nil {
		before = b.Dump(tenant)
	}
	changed := req
	changed.Held = tokens(5, 3)
	_, err := b.Ledger.Reserve(ctx, changed)
	require.ErrorIs(t, err, ledger.ErrConflict)
	if b.Dump != nil {
		assert.Equal(t, before, b.Dump(tenant), "a conflicting replay changes nothing")
	}
	assert.Equal(t, int64(7), usage(t, b, tenant, tenant).Reserved[ledger.Tokens])
	auditClean(t, b, tenant)
}

// T5: duplicate Settle, then a different actual.
func testDuplicateSettle(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	alignToWindow(b, time.Hour, time.Second)
	tenant := newKey(1)
	req := simpleReq(tenant, tokens(50, 50), true, lim(ledger.Tokens, time.Hour, 1000), slots(4))
	_, err := b.Ledger.Reserve(ctx, req)
	require.NoError(t, err)
	a := tokens(50, 20)
	res := make([]ledger.Settlement, 100)
	errs := make([]error, 100)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range res {
		wg.Go(func() {
			<-start
			res[i], errs[i] = b.Ledger.Settle(ctx, req.Ref, a, ledger.SourceFinal)
		})
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i := range res {
		require.NoError(t, errs[i])
		assert.Equal(t, ledger.Settled, res[i].State)
		assert.Equal(t, a, res[i].Charged)
		if !res[i].Replayed {
			fresh++
		}
	}
	assert.Equal(t, 1, fresh, "exactly one Settle without Replayed")
	u := usage(t, b, tenant, tenant)
	assert.Equal(t, int64(70), committed(u, ledger.Tokens, time.Hour), "c += a once")
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens], "r -= h once")
	assert.Equal(t, int64(0), u.SlotsInUse)
	_, err = b.Ledger.Settle(ctx, req.Ref, tokens(50, 21), ledger.SourceFinal)
	require.ErrorIs(t, err, ledger.ErrConflict)
	assert.Equal(t, int64(70), committed(usage(t, b, tenant, tenant), ledger.Tokens, time.Hour), "c unchanged by the conflict")
	auditClean(t, b, tenant)
}

// T6: Settle and Reclaim fired together at lease expiry.
func testSettleRacingExpiry(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	alignToWindow(b, time.Hour, time.Second)
	tenant := newKey(1)
	const n = 1000
	rng := rand.New(rand.NewPCG(6, 6))
	reqs := make([]ledger.ReserveRequest, n)
	actual := make([]ledger.Amounts, n)
	var sum int64
	for i := range reqs {
		h := rng.Int64N(100) + 1
		reqs[i] = simpleReq(tenant, tokens(h, 0), true, lim(ledger.Tokens, time.Hour, 1<<40), slots(n))
		reqs[i].LeaseTTL = 10 * time.Second
		actual[i] = tokens(rng.Int64N(h)+1, 0)
		sum += actual[i][ledger.Tokens]
		_, err := b.Ledger.Reserve(ctx, reqs[i])
		require.NoError(t, err)
	}
	base := usage(t, b, tenant, tenant)
	require.Equal(t, int64(n), base.SlotsInUse)
	b.Advance(10 * time.Second)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range reqs {
		wg.Go(func() {
			<-start
			_, errs[i] = b.Ledger.Settle(ctx, reqs[i].Ref, actual[i], ledger.SourceFinal)
		})
	}
	for range 4 {
		wg.Go(func() {
			<-start
			for {
				st, err := b.Ledger.Reclaim(ctx, tenant, 50)
				if err != nil {
					t.Errorf("reclaim: %v", err)
					return
				}
				if st.Expired+st.Unresolved+st.Charged == 0 && !st.More {
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range reqs {
		require.NoError(t, errs[i])
		s, err := b.Ledger.Settle(ctx, reqs[i].Ref, actual[i], ledger.SourceFinal)
		require.NoError(t, err)
		assert.True(t, s.Replayed)
		assert.Equal(t, ledger.Settled, s.State, "directly or via UNRESOLVED")
	}
	u := usage(t, b, tenant, tenant)
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(0), u.SlotsInUse)
	assert.Equal(t, sum, committed(u, ledger.Tokens, time.Hour), "c == Σ actual")
	auditClean(t, b, tenant)
}

// T7: Settle after the lease ran out.
func testSettleAfterTTL(t *testing.T, f Factory) {
	cfg := DefaultConfig()
	b := f(t, cfg)
	ctx := t.Context()
	const w = 24 * time.Hour
	alignToWindow(b, w, time.Second)
	tenant := newKey(1)
	limits := []ledger.Limit{lim(ledger.Tokens, w, 1000), slots(2)}
	req := simpleReq(tenant, tokens(300, 300), true, limits...)
	req.LeaseTTL = 10 * time.Second
	_, err := b.Ledger.Reserve(ctx, req)
	require.NoError(t, err)
	b.Advance(10 * time.Second)
	st, err := b.Ledger.Reclaim(ctx, tenant, 100)
	require.NoError(t, err)
	assert.Equal(t, ledger.ReclaimStats{Unresolved: 1}, st)
	u := usage(t, b, tenant, tenant)
	assert.Equal(t, int64(0), u.SlotsInUse, "n −1")
	assert.Equal(t, int64(600), u.Reserved[ledger.Tokens], "r unchanged")
	assert.Equal(t, 1, u.Unresolved)
	_, err = b.Ledger.Extend(ctx, req.Ref, req.Owner, time.Minute)
	require.ErrorIs(t, err, ledger.ErrLeaseLost)
	_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, tokens(401, 0), false, limits...))
	d, ok := isDenied(err)
	require.Truef(t, ok, "a Reserve needing the held headroom is denied, got %v", err)
	assert.Equal(t, int64(600), d.Reserved)
	a := tokens(300, 100)
	s, err := b.Ledger.Settle(ctx, req.Ref, a, ledger.SourcePartial)
	require.NoError(t, err)
	assert.Equal(t, ledger.Settlement{State: ledger.Settled, Charged: a, Late: true}, s)
	u = usage(t, b, tenant, tenant)
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(400), committed(u, ledger.Tokens, w))
	s, err = b.Ledger.Settle(ctx, req.Ref, a, ledger.SourcePartial)
	require.NoError(t, err)
	assert.True(t, s.Replayed)
	b.Advance(cfg.TombstoneRetention + time.Second)
	_, err = b.Ledger.Reclaim(ctx, tenant, 100)
	require.NoError(t, err)
	orphans := 0
	if b.Orphans != nil {
		orphans = b.Orphans()
	}
	before := usage(t, b, tenant, tenant)
	_, err = b.Ledger.Settle(ctx, req.Ref, a, ledger.SourcePartial)
	require.ErrorIs(t, err, ledger.ErrNotFound, "tombstone aged out")
	assert.Equal(t, before, usage(t, b, tenant, tenant), "counters unchanged")
	if b.Orphans != nil {
		assert.Equal(t, orphans+1, b.Orphans(), "one orphan event")
	}
	auditClean(t, b, tenant)
}

// T11: corrupt state is refused before any write; other tenants still grant.
func testCorrupt(t *testing.T, f Factory) {
	tests := []struct {
		name string
		kind Corruption
		call func(b *Backend, req ledger.ReserveRequest) error
	}{
		{"negative r", NegativeReserved, func(b *Backend, req ledger.ReserveRequest) error {
			r := req
			r.Ref.ID = ledger.NewRequestID()
			_, err := b.Ledger.Reserve(t.Context(), r)
			return err
		}},
		{"unknown state", UnknownState, func(b *Backend, req ledger.ReserveRequest) error {
			_, err := b.Ledger.Settle(t.Context(), req.Ref, tokens(1, 1), ledger.SourceFinal)
			return err
		}},
		{"lease entry without record", LeaseWithoutRecord, func(b *Backend, req ledger.ReserveRequest) error {
			b.Advance(2 * time.Minute)
			_, err := b.Ledger.Reclaim(t.Context(), req.Ref.Tenant, 10)
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := f(t, DefaultConfig())
			if b.Corrupt == nil {
				t.Skip("backend has no Corrupt hook")
			}
			ctx := t.Context()
			alignToWindow(b, time.Hour, time.Second)
			tenant, other := newKey(1), newKey(1)
			req := simpleReq(tenant, tokens(10, 10), true, lim(ledger.Tokens, time.Hour, 1000), slots(3))
			_, err := b.Ledger.Reserve(ctx, req)
			require.NoError(t, err)
			require.NoError(t, b.Corrupt(tc.kind, req.Ref, tenant))
			var before string
			if b.Dump != nil {
				before = b.Dump(tenant)
			}
			err = tc.call(b, req)
			require.ErrorIs(t, err, ledger.ErrCorrupt)
			if b.Dump != nil {
				assert.Equal(t, before, b.Dump(tenant), "nothing written, nothing clamped")
			}
			_, err = b.Ledger.Reserve(ctx, simpleReq(other, tokens(10, 10), true, lim(ledger.Tokens, time.Hour, 1000)))
			assert.NoError(t, err, "other tenants still grant")
		})
	}
}

// T12: malformed policy and amounts write nothing.
func testMalformedPolicy(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	tenant, other := newKey(1), newKey(1)
	ok := simpleReq(tenant, tokens(1, 1), false, lim(ledger.Tokens, time.Hour, 100))
	ok.PolicyVersion = 5
	_, err := b.Ledger.Reserve(ctx, ok)
	require.NoError(t, err)
	tests := []struct {
		name   string
		mutate func(r *ledger.ReserveRequest)
		want   error
	}{
		{"limit below zero", func(r *ledger.ReserveRequest) { r.Scopes[0].Limits[0].Max = -1 }, ledger.ErrPolicy},
		{"limit above 2^50", func(r *ledger.ReserveRequest) { r.Scopes[0].Limits[0].Max = ledger.MaxAmount + 1 }, ledger.ErrPolicy},
		{"window zero", func(r *ledger.ReserveRequest) { r.Scopes[0].Limits[0].Window = 0 }, ledger.ErrPolicy},
		{"window fractional", func(r *ledger.ReserveRequest) { r.Scopes[0].Limits[0].Window = 1500 * time.Millisecond }, ledger.ErrPolicy},
		{"window above 31d", func(r *ledger.ReserveRequest) { r.Scopes[0].Limits[0].Window = 32 * 24 * time.Hour }, ledger.ErrPolicy},
		{"window on slots", func(r *ledger.ReserveRequest) {
			r.Scopes[0].Limits = append(r.Scopes[0].Limits, ledger.Limit{Dim: ledger.Slots, Window: time.Second, Max: 1})
		}, ledger.ErrPolicy},
		{"scope without policy", func(r *ledger.ReserveRequest) { r.Scopes[0].Limits = nil }, ledger.ErrPolicy},
		{"amount above 2^50", func(r *ledger.ReserveRequest) { r.Held[ledger.GPUMs] = ledger.MaxAmount + 1 }, ledger.ErrInvalid},
		{"tokens != input + output", func(r *ledger.ReserveRequest) { r.Held[ledger.Tokens]++ }, ledger.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before string
			if b.Dump != nil {
				before = b.Dump(tenant)
			}
			r := simpleReq(tenant, tokens(1, 1), false, lim(ledger.Tokens, time.Hour, 100))
			r.PolicyVersion = 5
			tc.mutate(&r)
			_, err := b.Ledger.Reserve(ctx, r)
			require.ErrorIs(t, err, tc.want)
			if b.Dump != nil {
				assert.Equal(t, before, b.Dump(tenant), "no writes")
			}
			_, err = b.Ledger.Reserve(ctx, simpleReq(other, tokens(1, 1), false, lim(ledger.Tokens, time.Hour, 100)))
			assert.NoError(t, err, "other tenants unaffected")
		})
	}
}

// T13: window rollover; holds carry, usage is charged to the admission window.
func testWindowRollover(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	const w, L = time.Hour, 1000
	alignToWindow(b, w, w-2*time.Second) // 2 s before window 0 ends
	end := ledger.WindowResetsAt(ledger.WindowIndex(b.Now(), w), w)
	tenant := newKey(1)
	limits := []ledger.Limit{lim(ledger.Tokens, w, L), slots(10)}
	u := simpleReq(tenant, tokens(100, 0), true, limits...)
	u.LeaseTTL = time.Second
	_, err := b.Ledger.Reserve(ctx, u)
	require.NoError(t, err)
	b.Advance(time.Second)
	st, err := b.Ledger.Reclaim(ctx, tenant, 100)
	require.NoError(t, err)
	assert.Equal(t, ledger.ReclaimStats{Unresolved: 1}, st, "window 0 still open: not charged yet")
	b.Advance(900 * time.Millisecond) // 100 ms before the end
	const h = 300
	a := simpleReq(tenant, tokens(h, 0), true, limits...)
	_, err = b.Ledger.Reserve(ctx, a)
	require.NoError(t, err)
	b.Advance(200 * time.Millisecond) // window 1
	st, err = b.Ledger.Reclaim(ctx, tenant, 100)
	require.NoError(t, err)
	assert.Equal(t, ledger.ReclaimStats{Charged: 1}, st, "the UNRESOLVED hold of window 0 is charged by the first Reclaim of window 1")
	_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, tokens(L-h+1, 0), false, limits...))
	d, ok := isDenied(err)
	require.Truef(t, ok, "the hold carries into window 1, got %v", err)
	assert.Equal(t, ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Window: w, Limit: L, Committed: 0,
		Reserved: h, Requested: L - h + 1, ResetsAt: end.Add(w), RetryAfter: w - 100*time.Millisecond}, normDenied(d))
	second := simpleReq(tenant, tokens(L-h, 0), false, limits...)
	_, err = b.Ledger.Reserve(ctx, second)
	require.NoError(t, err)
	_, err = b.Ledger.Settle(ctx, a.Ref, tokens(250, 0), ledger.SourceFinal)
	require.NoError(t, err)
	us := usage(t, b, tenant, tenant)
	assert.Equal(t, int64(0), committed(us, ledger.Tokens, w), "window 1's c unchanged: a belongs to window 0")
	assert.Equal(t, int64(L-h), us.Reserved[ledger.Tokens], "r holds only the second hold")
	auditClean(t, b, tenant)
}

func normDenied(d *ledger.DeniedError) ledger.DeniedError {
	out := *d
	out.ResetsAt = out.ResetsAt.UTC()
	return out
}

// T19: leak regressions, named after the litellm bugs they guard.
func testLeaks(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	alignToWindow(b, time.Hour, time.Second)
	limits := []ledger.Limit{lim(ledger.Tokens, time.Hour, 10000), slots(2)}
	tests := []struct {
		name string
		run  func(t *testing.T, req ledger.ReserveRequest) (wantC int64)
	}{
		{"Litellm1477_Upstream400SettlesWithActual", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner))
			_, err := b.Ledger.Settle(t.Context(), req.Ref, tokens(0, 0), ledger.SourceFinal)
			require.NoError(t, err)
			return 0
		}},
		{"Litellm20256_Upstream500SettlesNotSent", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner))
			err := b.Ledger.Release(t.Context(), req.Ref, req.Owner)
			require.ErrorIs(t, err, ledger.ErrDispatched, "never released after dispatch")
			_, err = b.Ledger.Settle(t.Context(), req.Ref, ledger.Amounts{}, ledger.SourceNotSent)
			require.NoError(t, err)
			return 0
		}},
		{"Litellm27955_UpstreamTimeoutSettlesPartial", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner))
			_, err := b.Ledger.Settle(t.Context(), req.Ref, tokens(100, 37), ledger.SourcePartial)
			require.NoError(t, err)
			return 137
		}},
		{"CancelWhileQueuedReleases", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.Release(t.Context(), req.Ref, req.Owner))
			err := b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner)
			require.ErrorIs(t, err, ledger.ErrAlreadyFinal, "a released request never dispatches")
			return 0
		}},
		{"CancelMidStreamSettlesPartial", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner))
			_, err := b.Ledger.Extend(t.Context(), req.Ref, req.Owner, 30*time.Second)
			require.NoError(t, err)
			_, err = b.Ledger.Settle(t.Context(), req.Ref, tokens(100, 5), ledger.SourcePartial)
			require.NoError(t, err)
			return 105
		}},
		{"Litellm35525_UnpricedResponseSettlesAtHold", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner))
			s, err := b.Ledger.Settle(t.Context(), req.Ref, req.Held, ledger.SourceHeld)
			require.NoError(t, err)
			assert.Equal(t, req.Held, s.Charged)
			return req.Held[ledger.Tokens]
		}},
		{"OwnerDiesMidStreamStaysUnresolved", func(t *testing.T, req ledger.ReserveRequest) int64 {
			require.NoError(t, b.Ledger.MarkDispatched(t.Context(), req.Ref, req.Owner))
			b.Advance(req.LeaseTTL)
			_, err := b.Ledger.Reclaim(t.Context(), req.Ref.Tenant, 10)
			require.NoError(t, err)
			u := usage(t, b, req.Ref.Tenant, req.Ref.Tenant)
			assert.Equal(t, req.Held[ledger.Tokens], u.Reserved[ledger.Tokens], "holds kept while UNRESOLVED")
			_, err = b.Ledger.Resolve(t.Context(), req.Ref)
			require.NoError(t, err)
			return req.Held[ledger.Tokens]
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tenant := newKey(1)
			req := simpleReq(tenant, tokens(100, 100), false, limits...)
			req.LeaseTTL = 5 * time.Second
			_, err := b.Ledger.Reserve(t.Context(), req)
			require.NoError(t, err)
			wantC := tc.run(t, req)
			u := usage(t, b, tenant, tenant)
			assert.Equal(t, int64(0), u.SlotsInUse, "n back to baseline")
			assert.Equal(t, int64(0), u.Reserved[ledger.Tokens], "no hold leaked")
			assert.Equal(t, wantC, committed(u, ledger.Tokens, time.Hour))
			auditClean(t, b, tenant)
		})
	}
}

// testStateMachine checks single transitions and their exact errors.
func testStateMachine(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	alignToWindow(b, time.Hour, time.Second)
	limits := []ledger.Limit{lim(ledger.Tokens, time.Hour, 1000), slots(1)}
	t.Run("release unknown id leaves a tombstone", func(t *testing.T) {
		tenant := newKey(1)
		req := simpleReq(tenant, tokens(1, 1), false, limits...)
		require.NoError(t, b.Ledger.Release(ctx, req.Ref, req.Owner))
		_, err := b.Ledger.Reserve(ctx, req)
		require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		assert.NoError(t, b.Ledger.Release(ctx, req.Ref, req.Owner), "a replayed Release is fine")
	})
	t.Run("slot full denies MarkDispatched and keeps RESERVED", func(t *testing.T) {
		tenant := newKey(1)
		first := simpleReq(tenant, tokens(1, 1), true, limits...)
		_, err := b.Ledger.Reserve(ctx, first)
		require.NoError(t, err)
		second := simpleReq(tenant, tokens(1, 1), false, limits...)
		_, err = b.Ledger.Reserve(ctx, second)
		require.NoError(t, err)
		err = b.Ledger.MarkDispatched(ctx, second.Ref, second.Owner)
		d, ok := isDenied(err)
		require.Truef(t, ok, "got %v", err)
		assert.Equal(t, ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Slots, Limit: 1, Reserved: 1, Requested: 1}, *d)
		_, err = b.Ledger.Settle(ctx, first.Ref, tokens(1, 1), ledger.SourceFinal)
		require.NoError(t, err)
		require.NoError(t, b.Ledger.MarkDispatched(ctx, second.Ref, second.Owner))
		require.NoError(t, b.Ledger.MarkDispatched(ctx, second.Ref, second.Owner), "replay")
		require.ErrorIs(t, b.Ledger.MarkDispatched(ctx, second.Ref, ledger.Owner{2}), ledger.ErrLeaseLost)
		_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, tokens(1, 1), true, limits...))
		d, ok = isDenied(err)
		require.Truef(t, ok, "Dispatch=true on a full slot limit is denied, got %v", err)
		assert.Equal(t, ledger.Slots, d.Dim)
	})
	t.Run("extend and release rules", func(t *testing.T) {
		tenant := newKey(1)
		req := simpleReq(tenant, tokens(1, 1), false, limits...)
		g, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, b.Now().Add(60*time.Second).UnixMilli(), g.LeaseExpiry.UnixMilli(), "default lease")
		exp, err := b.Ledger.Extend(ctx, req.Ref, req.Owner, 90*time.Second)
		require.NoError(t, err)
		assert.Equal(t, b.Now().Add(90*time.Second).UnixMilli(), exp.UnixMilli())
		_, err = b.Ledger.Extend(ctx, req.Ref, req.Owner, time.Hour)
		require.ErrorIs(t, err, ledger.ErrInvalid, "over MaxLeaseTTL")
		_, err = b.Ledger.Extend(ctx, req.Ref, ledger.Owner{9}, time.Second)
		require.ErrorIs(t, err, ledger.ErrLeaseLost, "another owner")
		require.ErrorIs(t, b.Ledger.Release(ctx, req.Ref, ledger.Owner{9}), ledger.ErrLeaseLost)
		require.NoError(t, b.Ledger.Release(ctx, req.Ref, req.Owner))
		_, err = b.Ledger.Extend(ctx, req.Ref, req.Owner, time.Second)
		require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		s, err := b.Ledger.Settle(ctx, req.Ref, tokens(1, 0), ledger.SourceFinal)
		require.NoError(t, err)
		assert.Equal(t, ledger.Settlement{State: ledger.SettledLate, Charged: tokens(1, 0), Late: true}, s, "a protocol violation, charged only")
		assert.Equal(t, int64(1), committed(usage(t, b, tenant, tenant), ledger.Tokens, time.Hour))
		assert.Equal(t, int64(0), usage(t, b, tenant, tenant).Reserved[ledger.Tokens], "never mints")
		auditClean(t, b, tenant)
	})
	t.Run("resolve", func(t *testing.T) {
		tenant := newKey(1)
		req := simpleReq(tenant, tokens(10, 10), true, limits...)
		req.LeaseTTL = time.Second
		_, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		_, err = b.Ledger.Resolve(ctx, req.Ref)
		require.ErrorIs(t, err, ledger.ErrConflict, "not unresolved yet")
		b.Advance(time.Second)
		_, err = b.Ledger.Reclaim(ctx, tenant, 10)
		require.NoError(t, err)
		s, err := b.Ledger.Resolve(ctx, req.Ref)
		require.NoError(t, err)
		assert.Equal(t, ledger.Settlement{State: ledger.Charged, Charged: req.Held, Late: true}, s)
		s, err = b.Ledger.Resolve(ctx, req.Ref)
		require.NoError(t, err)
		assert.True(t, s.Replayed)
		_, err = b.Ledger.Settle(ctx, req.Ref, tokens(1, 1), ledger.SourceFinal)
		require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		_, err = b.Ledger.Resolve(ctx, ledger.Ref{Tenant: tenant, ID: ledger.NewRequestID()})
		require.ErrorIs(t, err, ledger.ErrNotFound)
		auditClean(t, b, tenant)
	})
	t.Run("headroom and warnings", func(t *testing.T) {
		tenant, wf := newKey(1), newKey(3)
		req := simpleReq(tenant, tokens(100, 0), false, lim(ledger.Tokens, time.Hour, 1000), lim(ledger.Tokens, time.Minute, 400))
		req.Scopes = append(req.Scopes, ledger.Scope{Kind: ledger.KindWorkflow, Key: wf, Limits: []ledger.Limit{
			{Dim: ledger.Tokens, Window: time.Hour, Max: 50, Mode: ledger.Warn}}})
		g, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		room := g.Headroom[ledger.Tokens]
		assert.Equal(t, ledger.Room{Tracked: true, Limit: 400, Remaining: 300, Window: time.Minute}, ledger.Room{
			Tracked: room.Tracked, Limit: room.Limit, Remaining: room.Remaining, Window: room.Window}, "the tightest limit")
		assert.False(t, g.Headroom[ledger.GPUMs].Tracked)
		require.Len(t, g.Warnings, 1)
		assert.Equal(t, ledger.KindWorkflow, g.Warnings[0].Scope)
		assert.Equal(t, int64(100), g.Warnings[0].Used)
	})
	t.Run("not found", func(t *testing.T) {
		ref := ledger.Ref{Tenant: newKey(1), ID: ledger.NewRequestID()}
		require.ErrorIs(t, b.Ledger.MarkDispatched(ctx, ref, ledger.Owner{1}), ledger.ErrNotFound)
		_, err := b.Ledger.Extend(ctx, ref, ledger.Owner{1}, time.Second)
		require.ErrorIs(t, err, ledger.ErrNotFound)
		_, err = b.Ledger.Settle(ctx, ref, tokens(1, 1), ledger.SourceFinal)
		require.ErrorIs(t, err, ledger.ErrNotFound)
		assert.ErrorIs(t, err, ledger.ErrNotFound)
	})
}
