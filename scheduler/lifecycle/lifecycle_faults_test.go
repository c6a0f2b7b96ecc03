package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// Faults of a call's lifecycle against the ledger: lost replies, leases and
// fencing, ambiguous endings, outages, restarts and fleet-shared admin
// state.

// TestLostReplyIsSuccess: the store client retries a Reserve whose
// reply was lost; the retry finds the record it just wrote (Replayed). For
// a request without an Idempotency-Key that is this very request: it runs,
// and nothing stays held.
func TestLostReplyIsSuccess(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	led.OnReserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
		if _, err := led.Memory.Reserve(ctx, req); err != nil {
			return ledger.Grant{}, err, true
		}
		g, err := led.Memory.Reserve(ctx, req) // the retry after the lost reply
		require.False(t, g.Replayed, "same attempt nonce: the original grant")
		return g, err, true
	}
	up := &lifecycletest.Upstream{Out: 3}
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)

	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err, "no 409 without an Idempotency-Key")
	assert.Equal(t, int64(1), up.Runs.Load())
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, ledger.Amounts{}, u.Reserved, "nothing stranded")
	assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour), "settled once")

	// The same lost reply under an Idempotency-Key is still this attempt.
	_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k1"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), up.Runs.Load())
}

// TestDuplicateIsInFlight: another attempt holding the key's id (a
// concurrent duplicate) is 409 with details.state in_flight; it never runs.
func TestDuplicateIsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2, Gate: make(chan struct{})}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		first := make(chan error, 1)
		go func() {
			_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
			first <- err
		}()
		synctest.Wait()
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
		ae := apierr.For(err)
		assert.Equal(t, 409, ae.Status)
		assert.Equal(t, map[string]any{"state": "in_flight"}, ae.Details)
		close(up.Gate)
		require.NoError(t, <-first)
		assert.Equal(t, int64(1), up.Runs.Load())
	})
}

// TestQueuedHoldRenewed: a request queued longer than lease_ttl
// keeps its hold (its lease is renewed while it waits) and is dispatched
// with a live lease, not 502.
//
// The tenant queues in EDF order: a FIFO queue sheds what has stood 2 s
// (queue.ShedAfter), and this test is about the lease, not the queue.
func TestQueuedHoldRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2, Gate: make(chan struct{})}
		cfg := lifecycletest.Config(t, "ledger: {lease_ttl: 3s}\nserver: {max_wait: 60s}\n", "    concurrency: 1\n    queue: {max_wait: 60s, order: edf}\n")
		s := newTestEngine(t, cfg, led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.settler.Heartbeat(ctx) }()
		go func() { _ = s.q.Run(ctx) }()
		reclaim := func() {
			_, err := led.Reclaim(context.Background(), s.pol.Load().Tenants["acme"].ScopeKey, 100)
			require.NoError(t, err)
		}

		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() {
				_, errs[i] = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: fmt.Sprint("r", i)})
			})
			synctest.Wait()
		}
		// The second waits behind the first (concurrency 1) for 10 lease
		// lifetimes; the ledger reclaims expired leases meanwhile.
		for range 30 {
			time.Sleep(time.Second)
			reclaim()
		}
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, int64(2), u.Reserved[ledger.Requests], "both holds alive after 30s on a 3s lease")
		close(up.Gate)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1], "dispatched with a live lease")
		assert.Equal(t, int64(2), up.Runs.Load())
		u = tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Zero(t, u.Unresolved)
	})
}

// TestFenceBeforeLapse: with the store unable to extend, every
// running call is fenced (aborted upstream) before its lease can lapse —
// with many calls at once and Extends that hang to their timeout.
func TestFenceBeforeLapse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1, Gate: make(chan struct{})}
		cfg := lifecycletest.Config(t, "", "    concurrency: 300\n")
		s := newTestEngine(t, cfg, led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.settler.Heartbeat(ctx) }()

		led.Set(func() {
			led.OnExtend = func(ctx context.Context, _ ledger.Ref) (time.Time, error, bool) {
				<-ctx.Done() // a store that never answers
				return time.Time{}, fmt.Errorf("%w: %w", ledger.ErrAmbiguous, ctx.Err()), true
			}
		})
		const n = 200
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var fenced int
		var latest time.Duration
		for i := range n {
			wg.Go(func() {
				_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: fmt.Sprint("r", i)})
				mu.Lock()
				defer mu.Unlock()
				if errors.Is(err, ledger.ErrLeaseLost) {
					fenced++
					latest = max(latest, time.Since(start))
				}
			})
		}
		wg.Wait()
		assert.Equal(t, n, fenced, "every call fenced")
		ttl := s.pol.Load().LeaseTTL
		assert.Less(t, latest, ttl, "fenced before the 60s lease could lapse")
		assert.Equal(t, int64(n), up.Runs.Load())
	})
}

// TestOutboxReleasesNeverDispatched: an ambiguous Reserve (the
// store applied it, the reply was lost) without an outage allowance is
// 503 and its hold is ended by Release, not Settle(0); an ambiguous
// Reserve that never applied leaves a tombstone.
func TestOutboxReleasesNeverDispatched(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprint("applied=", applied), func(t *testing.T) {
			led := lifecycletest.NewLedger(t)
			var ref ledger.Ref
			led.OnReserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
				ref = req.Ref
				if applied {
					_, _ = led.Memory.Reserve(ctx, req)
				}
				return ledger.Grant{}, fmt.Errorf("%w: reply lost", ledger.ErrAmbiguous), true
			}
			s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &lifecycletest.Upstream{Out: 1})
			_, err := serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
			assert.Equal(t, 503, apierr.For(err).Status)
			require.Equal(t, 1, s.settler.Pending())
			s.settler.Flush(context.Background())
			assert.Equal(t, 0, s.settler.Pending())
			assert.Equal(t, 1, led.N("release"))
			assert.Equal(t, 0, led.N("settle"), "a never-dispatched hold is released, not settled")
			u := tenantUsage(t, s, led.Memory)
			assert.Equal(t, ledger.Amounts{}, u.Reserved)
			// Either way the id is now final: a late Reserve cannot apply.
			led.OnReserve = nil
			_, err = led.Memory.Reserve(context.Background(), ledger.ReserveRequest{Ref: ref, Owner: s.owner,
				Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: ref.Tenant, Limits: s.pol.Load().Tenants["acme"].Limits}},
				Held:   ledger.Amounts{ledger.Requests: 1}})
			assert.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		})
	}
}

// TestLeaseLostStatus: a lost lease is a proper status, not the
// 502 fallthrough.
func TestLeaseLostStatus(t *testing.T) {
	ae := apierr.For(ledger.ErrLeaseLost)
	assert.Equal(t, 503, ae.Status)
	assert.Equal(t, "ledger_unavailable", ae.Code)
	assert.Equal(t, 502, apierr.For(apierr.MidStream(ledger.ErrLeaseLost)).Status, "mid-stream it is the replica's work cut")
	assert.Equal(t, 504, apierr.For(apierr.MidStream(apierr.ErrDeadline)).Status)
	assert.Equal(t, 502, apierr.For(apierr.MidStream(apierr.Invalidf("", "x"))).Status, "never a 4xx after the 200")
}

// TestMultipliersBounded: n and every product of client values
// are bounded: 400 invalid_request naming the parameter, never a 500.
func TestMultipliersBounded(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	cfg := lifecycletest.Config(t, "prices:\n  - {model: m, input_per_mtok: 1000000000000, output_per_mtok: 1000000000000}\n",
		"    max_output_tokens: 100000000000000\n    max_input_tokens: 1000000000000\n")
	s := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 1})
	for _, tc := range []struct {
		name, extra, param string
	}{
		{"n", `,"n":1073741824`, "n"},
		{"n past 128", `,"n":129`, "n"},
		{"price times tokens", `,"max_tokens":100000000000`, "max_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.extra + `}`)
			_, err := serve(context.Background(), s, admission{body: body})
			ae := apierr.For(err)
			assert.Equal(t, 400, ae.Status, "%v", err)
			assert.Equal(t, "invalid_request", ae.Code)
			assert.Equal(t, tc.param, ae.Param, "%v", err)
		})
	}
	assert.Zero(t, led.N("reserve"), "nothing reached the ledger")
	_, ok := mulAmount(ledger.MaxAmount, 2)
	assert.False(t, ok)
	v, ok := mulAmount(1<<25, 1<<25)
	assert.True(t, ok)
	assert.Equal(t, int64(1<<50), v)
}

// TestUnresolvedResolves: a tenant without a windowed budget
// still gets its UNRESOLVED records charged when a window closes.
func TestUnresolvedResolves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &lifecycletest.Upstream{Out: 1})
		tn := s.pol.Load().Tenants["acme"]
		ctx := context.Background()
		ref := ledger.Ref{Tenant: tn.ScopeKey, ID: ledger.NewRequestID()}
		_, err := led.Memory.Reserve(ctx, ledger.ReserveRequest{Ref: ref, Owner: s.owner, Dispatch: true,
			Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: tn.ScopeKey, Limits: tn.Limits}},
			Held:   ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 4, ledger.Tokens: 4}, LeaseTTL: 3 * time.Second})
		require.NoError(t, err)
		time.Sleep(4 * time.Second)
		st, err := led.Reclaim(ctx, tn.ScopeKey, 100)
		require.NoError(t, err)
		require.Equal(t, 1, st.Unresolved, "the owner died: UNRESOLVED")
		time.Sleep(time.Hour)
		st, err = led.Reclaim(ctx, tn.ScopeKey, 100)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Charged, "charged at its hold once the window closed")
		u := tenantUsage(t, s, led.Memory)
		assert.Zero(t, u.Unresolved)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
	})
}

// TestSlotDenialRequeues: another instance holds the tenant's slots; the
// call goes back to the head of its queue holding its budget and runs
// once a slot frees, exactly once.
func TestSlotDenialRequeues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1}
		s := newTestEngine(t, lifecycletest.Config(t, "", "    concurrency: 1\n"), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		var denials int
		led.OnDispatch = func(context.Context, ledger.Ref) (error, bool) {
			if denials < 3 {
				denials++
				return &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Slots, Limit: 1, Reserved: 1, Requested: 1}, true
			}
			return nil, false
		}
		done := make(chan error, 1)
		go func() {
			_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
			done <- err
		}()
		// Each denial requeues; the dispatch loop retries when woken.
		for range 3 {
			synctest.Wait()
			s.Wake()
		}
		require.NoError(t, <-done)
		assert.Equal(t, 4, led.N("dispatch"))
		assert.Equal(t, int64(1), up.Runs.Load(), "executed once")
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
	})
}

// TestCancelWhileQueued: a client that leaves while queued is released at
// once and never dispatched.
func TestCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1, Gate: make(chan struct{})}
		s := newTestEngine(t, lifecycletest.Config(t, "", "    concurrency: 1\n"), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		first := make(chan error, 1)
		go func() { _, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")}); first <- err }()
		synctest.Wait()
		cctx, leave := context.WithCancelCause(ctx)
		second := make(chan error, 1)
		go func() {
			_, err := serve(cctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "b"})
			second <- err
		}()
		synctest.Wait()
		leave(apierr.ErrClientGone)
		require.ErrorIs(t, <-second, apierr.ErrClientGone)
		close(up.Gate)
		require.NoError(t, <-first)
		assert.Equal(t, int64(1), up.Runs.Load(), "the cancelled call never ran")
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
		assert.Equal(t, 2, led.N("reserve"))
		assert.Equal(t, 1, led.N("release"))
	})
}

// TestIdempotencyRetryAfterNeverRanRuns: a first attempt that never ran
// (its client left while it queued) does not block the key: the retry runs,
// once.
func TestIdempotencyRetryAfterNeverRanRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2}
		s := newTestEngine(t, lifecycletest.Config(t, "", "    concurrency: 1\n"), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// No dispatch loop yet: the first attempt stays queued.
		cctx, leave := context.WithCancelCause(ctx)
		first := make(chan error, 1)
		go func() {
			_, err := serve(cctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
			first <- err
		}()
		synctest.Wait()
		leave(apierr.ErrClientGone)
		require.ErrorIs(t, <-first, apierr.ErrClientGone)
		go s.dispatchLoop(ctx)
		body, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
		require.NoError(t, err, "a retry after a first attempt that never ran may run")
		assert.NotEmpty(t, body)
		assert.Equal(t, int64(1), up.Runs.Load())
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
	})
}

// TestIdempotencyCompletedReturnsOriginal: a retry of a completed
// non-streamed request gets the original body and never runs again.
func TestIdempotencyCompletedReturnsOriginal(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	up := &lifecycletest.Upstream{Out: 3}
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: lifecycletest.ChatBody(""), idemKey: "k", reqID: "a"})
	require.NoError(t, err)
	require.NoError(t, s.await(c))
	require.NoError(t, s.execute(c))
	body, err := s.drainStream(c)
	require.NoError(t, err)
	s.finish(c, nil)
	s.rememberResponse(c, body)
	c.end()

	_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
	var replay *cachedResponse
	require.ErrorAs(t, err, &replay)
	assert.Equal(t, body, replay.body)
	assert.Equal(t, int64(1), up.Runs.Load(), "never executed twice")

	// Another instance (or after eviction): 409 completed, still no run.
	other := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	_, err = serve(ctx, other, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
	ae := apierr.For(err)
	assert.Equal(t, 409, ae.Status)
	assert.Equal(t, map[string]any{"state": "completed"}, ae.Details)
	assert.Equal(t, int64(1), up.Runs.Load())
}

// outageLedger fails every Reserve as unreachable while down is set.
func outageLedger(t *testing.T) (*lifecycletest.Ledger, *atomic.Bool) {
	led := lifecycletest.NewLedger(t)
	var down atomic.Bool
	led.OnReserve = func(context.Context, ledger.ReserveRequest) (ledger.Grant, error, bool) {
		if down.Load() {
			return ledger.Grant{}, ledger.ErrUnavailable, true
		}
		return ledger.Grant{}, nil, false
	}
	return led, &down
}

const outageTenant = "    outage_allowance: {requests: 10, tokens: 100000}\n    budgets:\n      - {dimension: tokens, limit: 1000000, window: 1h}\n"

// TestOutageNeverRunsAKeyTwice: one Idempotency-Key ran four
// times on 6099134 (outage admission replaced its id). Now a key whose
// first attempt ran is never run again during an outage (the ledger alone
// knows it ran: a keyed request is 503 while the ledger is down), and after
// recovery its retries get the first response. An unkeyed request is
// outage-admitted and charged once under its own id.
func TestOutageNeverRunsAKeyTwice(t *testing.T) {
	led, down := outageLedger(t)
	up := &lifecycletest.Upstream{Out: 3}
	s := newTestEngine(t, lifecycletest.Config(t, "", outageTenant), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	a := admission{body: lifecycletest.ChatBody(""), idemKey: "k"}
	first, err := serve(ctx, s, a)
	require.NoError(t, err)
	down.Store(true)
	for range 3 {
		_, err = serve(ctx, s, a)
		assert.Equal(t, 503, apierr.For(err).Status, "a retry during the outage does not run: %v", err)
		_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "fresh"})
		assert.Equal(t, 503, apierr.For(err).Status, "nor does a new key: only the ledger could tell: %v", err)
	}
	_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err, "an unkeyed request runs on the outage allowance")
	assert.Equal(t, int64(2), up.Runs.Load())

	down.Store(false)
	_, err = serve(ctx, s, a)
	var replay *cachedResponse
	require.ErrorAs(t, err, &replay)
	assert.Equal(t, first, replay.body, "recovered: the first response")
	other := newTestEngine(t, lifecycletest.Config(t, "", outageTenant), led, up) // another instance: the ledger decides
	_, err = serve(ctx, other, a)
	assert.Equal(t, map[string]any{"state": "completed"}, apierr.For(err).Details, "%v", err)
	s.settler.ChargeOutages(ctx)
	assert.Equal(t, 1, led.N("charge"))
	assert.Equal(t, int64(2), up.Runs.Load(), "the key ran once")
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(2*(5+3)), lifecycletest.Committed(u, ledger.Tokens, time.Hour), "both runs charged once")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestOutageUsagePersisted: outage usage not yet charged survives
// a restart and is billed exactly once; a call still running at the crash
// is billed at its hold.
func TestOutageUsagePersisted(t *testing.T) {
	dir := t.TempDir()
	led, down := outageLedger(t)
	up := &lifecycletest.Upstream{Out: 3}
	top := fmt.Sprintf("admin: {state_file: %q}\n", dir+"/admin.json")
	cfg := lifecycletest.Config(t, top, outageTenant)
	s1 := newTestEngine(t, cfg, led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s1.dispatchLoop(ctx)
	down.Store(true)
	_, err := serve(ctx, s1, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	// A second call admitted and "running" when the process dies.
	pol := s1.pol.Load()
	c, err := s1.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: lifecycletest.ChatBody(""), reqID: "crash"})
	require.NoError(t, err)
	require.True(t, c.outage)
	held := c.held[ledger.Tokens]

	// Restart: a new process reads the owed charges.
	down.Store(false)
	s2 := newTestEngine(t, cfg, led, up)
	s2.settler.ChargeOutages(ctx)
	s2.settler.ChargeOutages(ctx)
	s3 := newTestEngine(t, cfg, led, up)
	s3.settler.ChargeOutages(ctx)
	assert.Equal(t, 2, led.N("charge"), "each owed charge sent once, then dropped")
	u := tenantUsage(t, s2, led.Memory)
	assert.Equal(t, int64(5+3)+held, lifecycletest.Committed(u, ledger.Tokens, time.Hour), "usage of the finished call plus the hold of the one that died")
}

// TestCancelRacesDispatch: the client leaves just as the dispatch loop
// picked its call (the queue entry is no longer cancellable): the call
// gives back the replica room and the queue slot, releases its hold, and
// never runs.
func TestCancelRacesDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		cctx, leave := context.WithCancelCause(context.Background())
		done := make(chan error, 1)
		go func() { _, err := serve(cctx, s, admission{body: lifecycletest.ChatBody("")}); done <- err }()
		synctest.Wait()
		// The dispatch loop's step, without delivering yet.
		it, ok := s.q.NextView(s.admissible)
		require.True(t, ok)
		rep := it.Payload.rep
		require.Positive(t, rep.Load.Load(), "room reserved for it")
		leave(apierr.ErrClientGone)
		synctest.Wait() // await lost the cancel race and waits for the hand-off
		it.Payload.dispatched <- rep
		require.ErrorIs(t, <-done, apierr.ErrClientGone)
		assert.Zero(t, rep.Load.Load(), "replica room given back")
		assert.Zero(t, up.Runs.Load(), "never ran")
		assert.Equal(t, 0, led.N("dispatch"), "no slot taken")
		assert.Equal(t, 1, led.N("release"))
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
		st, ok := s.q.Stats("acme")
		require.True(t, ok)
		assert.Zero(t, st.Depth)
	})
}

// TestOutboxRetriesSettle: a settlement the store could not take is
// retried by the outbox, with the same id, until it lands: charged once.
func TestOutboxRetriesSettle(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &lifecycletest.Upstream{Out: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	var fail atomic.Int64
	fail.Store(3)
	led.Set(func() {
		led.OnSettle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			if fail.Add(-1) >= 0 {
				return ledger.Settlement{}, ledger.ErrUnavailable, true
			}
			return ledger.Settlement{}, nil, false
		}
	})
	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err, "the client's answer does not wait for the ledger")
	require.Equal(t, 1, s.settler.Pending())
	s.settler.Flush(ctx)
	s.settler.Flush(ctx)
	assert.Equal(t, 1, s.settler.Pending(), "still failing: kept")
	s.settler.Flush(ctx)
	assert.Equal(t, 0, s.settler.Pending())
	assert.Equal(t, 4, led.N("settle"))
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour), "charged once")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestAmbiguousKeyedReserveSparesOtherAttempt (found by test/chaos on
// redis): a retry's Reserve of an Idempotency-Key is ambiguous while the
// first attempt holds the id. Ending "its" hold by id would release or
// zero-settle the first attempt's record; the outbox instead replays the
// retry's attempt, which finds another attempt's record and leaves it. An
// ambiguous keyed Reserve that did apply is released.
func TestAmbiguousKeyedReserveSparesOtherAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 3, Gate: make(chan struct{})}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		first := make(chan error, 1)
		go func() {
			_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
			first <- err
		}()
		synctest.Wait()
		led.Set(func() {
			led.OnReserve = func(context.Context, ledger.ReserveRequest) (ledger.Grant, error, bool) {
				return ledger.Grant{}, fmt.Errorf("%w: timeout", ledger.ErrAmbiguous), true
			}
		})
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
		assert.Equal(t, 503, apierr.For(err).Status)
		led.Set(func() { led.OnReserve = nil })
		s.settler.Flush(ctx)
		assert.Zero(t, s.settler.Pending())
		assert.Zero(t, led.N("release"), "the first attempt's record is not ended")
		close(up.Gate)
		require.NoError(t, <-first)
		assert.Equal(t, 1, led.N("settle"))
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
		assert.Equal(t, ledger.Amounts{}, u.Reserved)

		// Applied, then the reply was lost: the replay owns it and releases.
		led.Set(func() {
			led.OnReserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
				_, _ = led.Memory.Reserve(ctx, req)
				return ledger.Grant{}, fmt.Errorf("%w: reply lost", ledger.ErrAmbiguous), true
			}
		})
		_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k2"})
		assert.Equal(t, 503, apierr.For(err).Status)
		led.Set(func() { led.OnReserve = nil })
		s.settler.Flush(ctx)
		assert.Equal(t, 1, led.N("release"))
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
		// And the key may run now: its first attempt never ran.
		_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k2"})
		require.NoError(t, err)
	})
}

// TestOutboxSurvivesRestart: endings the store did not take are kept in the
// outbox file; a restarted process (another owner) settles the dispatched
// call with the usage the first process had and releases the hold of the
// ambiguous Reserve it left, where the leases alone would end both later,
// the dispatched one charged its whole hold.
func TestOutboxSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	led := lifecycletest.NewLedger(t)
	cfg := lifecycletest.Config(t, fmt.Sprintf("admin: {state_file: %q}\n", dir+"/admin.json"),
		"    budgets:\n      - {dimension: tokens, limit: 1000000, window: 1h}\n      - {dimension: requests, limit: 1000, window: 1h}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	led.Set(func() {
		led.OnSettle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
		led.OnRelease = func(context.Context, ledger.Ref) (error, bool) { return ledger.ErrUnavailable, true }
	})
	s1 := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 3})
	go s1.dispatchLoop(ctx)
	_, err := serve(ctx, s1, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	led.Set(func() {
		led.OnReserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
			_, _ = led.Memory.Reserve(ctx, req)
			return ledger.Grant{}, fmt.Errorf("%w: reply lost", ledger.ErrAmbiguous), true
		}
	})
	_, err = serve(ctx, s1, admission{body: lifecycletest.ChatBody("")})
	assert.Equal(t, 503, apierr.For(err).Status)
	require.Equal(t, 2, s1.settler.Pending())
	s1.settler.Flush(ctx)
	require.Equal(t, 2, s1.settler.Pending(), "the store still refuses: kept")

	// s1 is gone (killed: it never flushes again); the store is back.
	led.Set(func() { led.OnSettle, led.OnRelease, led.OnReserve = nil, nil, nil })
	s2 := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 3})
	require.NotEqual(t, s1.owner, s2.owner)
	require.Equal(t, 2, s2.settler.Pending(), "read from the file")
	s2.settler.Flush(ctx)
	assert.Zero(t, s2.settler.Pending())
	u := tenantUsage(t, s2, led.Memory)
	assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour), "the dispatched call charged once")
	assert.Equal(t, int64(5+3), lifecycletest.Committed(u, ledger.Tokens, time.Hour), "with the usage it had, not its hold")
	assert.Equal(t, ledger.Amounts{}, u.Reserved, "the ambiguous Reserve's hold released by its owner's id")

	s3 := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 3})
	assert.Zero(t, s3.settler.Pending(), "the file was rewritten without the ended entries")
}
