package scheduler

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
	"github.com/sluicehq/sluice/queue"
)

// Regression tests of issue 13, named after the item they pin. Each fails
// on 6099134 and passes after.

// TestBug13_2_LostReplyIsSuccess: the store client retries a Reserve whose
// reply was lost; the retry finds the record it just wrote (Replayed). For
// a request without an Idempotency-Key that is this very request: it runs,
// and nothing stays held.
func TestBug13_2_LostReplyIsSuccess(t *testing.T) {
	led := newFakeLedger(t)
	led.reserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
		if _, err := led.Memory.Reserve(ctx, req); err != nil {
			return ledger.Grant{}, err, true
		}
		g, err := led.Memory.Reserve(ctx, req) // the retry after the lost reply
		require.False(t, g.Replayed, "same attempt nonce: the original grant")
		return g, err, true
	}
	up := &fakeUpstream{out: 3}
	s := newTestServer(t, testConfig(t, "", ""), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)

	_, err := serve(s, ctx, admission{body: chatBody("")})
	require.NoError(t, err, "no 409 without an Idempotency-Key")
	assert.Equal(t, int64(1), up.runs.Load())
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, ledger.Amounts{}, u.Reserved, "nothing stranded")
	assert.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour), "settled once")

	// The same lost reply under an Idempotency-Key is still this attempt.
	_, err = serve(s, ctx, admission{body: chatBody(""), idemKey: "k1"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), up.runs.Load())
}

// TestBug13_2_DuplicateIsInFlight: another attempt holding the key's id (a
// concurrent duplicate) is 409 with details.state in_flight; it never runs.
func TestBug13_2_DuplicateIsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 2, gate: make(chan struct{})}
		s := newTestServer(t, testConfig(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		first := make(chan error, 1)
		go func() { _, err := serve(s, ctx, admission{body: chatBody(""), idemKey: "k"}); first <- err }()
		synctest.Wait()
		_, err := serve(s, ctx, admission{body: chatBody(""), idemKey: "k"})
		ae := statusFor(err)
		assert.Equal(t, 409, ae.Status)
		assert.Equal(t, map[string]any{"state": "in_flight"}, ae.Details)
		close(up.gate)
		require.NoError(t, <-first)
		assert.Equal(t, int64(1), up.runs.Load())
	})
}

// TestBug13_3_QueuedHoldRenewed: a request queued longer than lease_ttl
// keeps its hold (its lease is renewed while it waits) and is dispatched
// with a live lease, not 502.
func TestBug13_3_QueuedHoldRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 2, gate: make(chan struct{})}
		cfg := testConfig(t, "ledger: {lease_ttl: 3s}\nserver: {max_wait: 60s}\n", "    concurrency: 1\n    queue: {max_wait: 60s}\n")
		s := newTestServer(t, cfg, led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.heartbeatLoop(ctx) }()
		go func() { _ = s.q.Run(ctx) }()
		reclaim := func() {
			_, err := led.Memory.Reclaim(context.Background(), s.pol.Load().tenants["acme"].key, 100)
			require.NoError(t, err)
		}

		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { _, errs[i] = serve(s, ctx, admission{body: chatBody(""), reqID: fmt.Sprint("r", i)}) })
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
		close(up.gate)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1], "dispatched with a live lease")
		assert.Equal(t, int64(2), up.runs.Load())
		u = tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Zero(t, u.Unresolved)
	})
}

// TestBug13_10_FenceBeforeLapse: with the store unable to extend, every
// running call is fenced (aborted upstream) before its lease can lapse —
// with many calls at once and Extends that hang to their timeout.
func TestBug13_10_FenceBeforeLapse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 1, gate: make(chan struct{})}
		cfg := testConfig(t, "", "    concurrency: 300\n")
		s := newTestServer(t, cfg, led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.heartbeatLoop(ctx) }()

		led.set(func() {
			led.extend = func(ctx context.Context, _ ledger.Ref) (time.Time, error, bool) {
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
				_, err := serve(s, ctx, admission{body: chatBody(""), reqID: fmt.Sprint("r", i)})
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
		ttl := s.pol.Load().leaseTTL
		assert.Less(t, latest, ttl, "fenced before the 60s lease could lapse")
		assert.Equal(t, int64(n), up.runs.Load())
	})
}

// TestBug13_10_OutboxReleasesNeverDispatched: an ambiguous Reserve (the
// store applied it, the reply was lost) without an outage allowance is
// 503 and its hold is ended by Release, not Settle(0); an ambiguous
// Reserve that never applied leaves a tombstone.
func TestBug13_10_OutboxReleasesNeverDispatched(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprint("applied=", applied), func(t *testing.T) {
			led := newFakeLedger(t)
			var ref ledger.Ref
			led.reserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
				ref = req.Ref
				if applied {
					_, _ = led.Memory.Reserve(ctx, req)
				}
				return ledger.Grant{}, fmt.Errorf("%w: reply lost", ledger.ErrAmbiguous), true
			}
			s := newTestServer(t, testConfig(t, "", ""), led, &fakeUpstream{out: 1})
			_, err := serve(s, context.Background(), admission{body: chatBody("")})
			assert.Equal(t, 503, statusFor(err).Status)
			require.Equal(t, 1, s.outbox.len())
			s.flushOutbox(context.Background())
			assert.Equal(t, 0, s.outbox.len())
			assert.Equal(t, 1, led.n("release"))
			assert.Equal(t, 0, led.n("settle"), "a never-dispatched hold is released, not settled")
			u := tenantUsage(t, s, led.Memory)
			assert.Equal(t, ledger.Amounts{}, u.Reserved)
			// Either way the id is now final: a late Reserve cannot apply.
			led.reserve = nil
			_, err = led.Memory.Reserve(context.Background(), ledger.ReserveRequest{Ref: ref, Owner: s.owner,
				Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: ref.Tenant, Limits: s.pol.Load().tenants["acme"].limits}},
				Held:   ledger.Amounts{ledger.Requests: 1}})
			assert.ErrorIs(t, err, ledger.ErrAlreadyFinal)
		})
	}
}

// TestBug13_10_LeaseLostStatus: a lost lease is a proper status, not the
// 502 fallthrough.
func TestBug13_10_LeaseLostStatus(t *testing.T) {
	ae := statusFor(ledger.ErrLeaseLost)
	assert.Equal(t, 503, ae.Status)
	assert.Equal(t, "ledger_unavailable", ae.Code)
	assert.Equal(t, 502, statusFor(&streamError{cause: ledger.ErrLeaseLost}).Status, "mid-stream it is the replica's work cut")
	assert.Equal(t, 504, statusFor(&streamError{cause: ErrDeadline}).Status)
	assert.Equal(t, 502, statusFor(&streamError{cause: &badRequestError{msg: "x"}}).Status, "never a 4xx after the 200")
}

// TestBug13_9_MultipliersBounded: n and every product of client values
// are bounded: 400 invalid_request naming the parameter, never a 500.
func TestBug13_9_MultipliersBounded(t *testing.T) {
	led := newFakeLedger(t)
	cfg := testConfig(t, "prices:\n  - {model: m, input_per_mtok: 1000000000000, output_per_mtok: 1000000000000}\n",
		"    max_output_tokens: 100000000000000\n    max_input_tokens: 1000000000000\n")
	s := newTestServer(t, cfg, led, &fakeUpstream{out: 1})
	for _, tc := range []struct {
		name, extra, param string
	}{
		{"n", `,"n":1073741824`, "n"},
		{"n past 128", `,"n":129`, "n"},
		{"price times tokens", `,"max_tokens":100000000000`, "max_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.extra + `}`)
			_, err := serve(s, context.Background(), admission{body: body})
			ae := statusFor(err)
			assert.Equal(t, 400, ae.Status, "%v", err)
			assert.Equal(t, "invalid_request", ae.Code)
			assert.Equal(t, tc.param, ae.Param, "%v", err)
		})
	}
	assert.Zero(t, led.n("reserve"), "nothing reached the ledger")
	_, ok := mulAmount(ledger.MaxAmount, 2)
	assert.False(t, ok)
	v, ok := mulAmount(1<<25, 1<<25)
	assert.True(t, ok)
	assert.Equal(t, int64(1<<50), v)
}

// TestBug13_10_UnresolvedResolves: a tenant without a windowed budget
// still gets its UNRESOLVED records charged when a window closes.
func TestBug13_10_UnresolvedResolves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		s := newTestServer(t, testConfig(t, "", ""), led, &fakeUpstream{out: 1})
		tn := s.pol.Load().tenants["acme"]
		ctx := context.Background()
		ref := ledger.Ref{Tenant: tn.key, ID: ledger.NewRequestID()}
		_, err := led.Memory.Reserve(ctx, ledger.ReserveRequest{Ref: ref, Owner: s.owner, Dispatch: true,
			Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: tn.key, Limits: tn.limits}},
			Held:   ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 4, ledger.Tokens: 4}, LeaseTTL: 3 * time.Second})
		require.NoError(t, err)
		time.Sleep(4 * time.Second)
		st, err := led.Memory.Reclaim(ctx, tn.key, 100)
		require.NoError(t, err)
		require.Equal(t, 1, st.Unresolved, "the owner died: UNRESOLVED")
		time.Sleep(time.Hour)
		st, err = led.Memory.Reclaim(ctx, tn.key, 100)
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
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 1}
		s := newTestServer(t, testConfig(t, "", "    concurrency: 1\n"), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		var denials int
		led.dispatch = func(context.Context, ledger.Ref) (error, bool) {
			if denials < 3 {
				denials++
				return &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Slots, Limit: 1, Reserved: 1, Requested: 1}, true
			}
			return nil, false
		}
		done := make(chan error, 1)
		go func() {
			_, err := serve(s, ctx, admission{body: chatBody("")})
			done <- err
		}()
		// Each denial requeues; the dispatch loop retries when woken.
		for range 3 {
			synctest.Wait()
			s.signal(s.wake)
		}
		require.NoError(t, <-done)
		assert.Equal(t, 4, led.n("dispatch"))
		assert.Equal(t, int64(1), up.runs.Load(), "executed once")
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
	})
}

// TestCancelWhileQueued: a client that leaves while queued is released at
// once and never dispatched.
func TestCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 1, gate: make(chan struct{})}
		s := newTestServer(t, testConfig(t, "", "    concurrency: 1\n"), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		first := make(chan error, 1)
		go func() { _, err := serve(s, ctx, admission{body: chatBody("")}); first <- err }()
		synctest.Wait()
		cctx, leave := context.WithCancelCause(ctx)
		second := make(chan error, 1)
		go func() { _, err := serve(s, cctx, admission{body: chatBody(""), reqID: "b"}); second <- err }()
		synctest.Wait()
		leave(ErrClientGone)
		assert.ErrorIs(t, <-second, ErrClientGone)
		close(up.gate)
		require.NoError(t, <-first)
		assert.Equal(t, int64(1), up.runs.Load(), "the cancelled call never ran")
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
		assert.Equal(t, 2, led.n("reserve"))
		assert.Equal(t, 1, led.n("release"))
	})
}

// TestDrainTimeoutAborts: calls still running at the drain timeout are
// aborted and settled from what they streamed; nothing stays held.
func TestDrainTimeoutAborts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 1, gate: make(chan struct{})}
		s := newTestServer(t, testConfig(t, "server: {drain_timeout: 5s}\n", ""), led, up)
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- s.Run(ctx) }()
		errs := make(chan error, 3)
		for i := range 3 {
			go func() {
				_, err := serve(s, context.Background(), admission{body: chatBody(""), reqID: fmt.Sprint(i)})
				errs <- err
			}()
		}
		synctest.Wait()
		start := time.Now()
		stop()
		for range 3 {
			assert.ErrorIs(t, <-errs, ErrDraining)
		}
		assert.Equal(t, 5*time.Second, time.Since(start).Round(time.Second))
		require.NoError(t, <-ran)
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Equal(t, int64(3), committed(u, ledger.Requests, time.Hour), "three aborted calls charged")
		_ = queue.ErrExpired
	})
}

// TestIdempotencyRetryAfterNeverRanRuns: a first attempt that never ran
// (its client left while it queued) does not block the key: the retry runs,
// once.
func TestIdempotencyRetryAfterNeverRanRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 2}
		s := newTestServer(t, testConfig(t, "", "    concurrency: 1\n"), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// No dispatch loop yet: the first attempt stays queued.
		cctx, leave := context.WithCancelCause(ctx)
		first := make(chan error, 1)
		go func() { _, err := serve(s, cctx, admission{body: chatBody(""), idemKey: "k"}); first <- err }()
		synctest.Wait()
		leave(ErrClientGone)
		assert.ErrorIs(t, <-first, ErrClientGone)
		go s.dispatchLoop(ctx)
		body, err := serve(s, ctx, admission{body: chatBody(""), idemKey: "k"})
		require.NoError(t, err, "a retry after a first attempt that never ran may run")
		assert.NotEmpty(t, body)
		assert.Equal(t, int64(1), up.runs.Load())
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour))
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
	})
}

// TestIdempotencyCompletedReturnsOriginal: a retry of a completed
// non-streamed request gets the original body and never runs again.
func TestIdempotencyCompletedReturnsOriginal(t *testing.T) {
	led := newFakeLedger(t)
	up := &fakeUpstream{out: 3}
	s := newTestServer(t, testConfig(t, "", ""), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.tenants["acme"], pol, admission{ep: 1, body: chatBody(""), idemKey: "k", reqID: "a"})
	require.NoError(t, err)
	require.NoError(t, s.await(c))
	require.NoError(t, s.execute(c))
	body, err := s.drainStream(c)
	require.NoError(t, err)
	s.finish(c, nil)
	s.rememberResponse(c, body)
	c.end()

	_, err = serve(s, ctx, admission{body: chatBody(""), idemKey: "k"})
	var replay *cachedResponse
	require.ErrorAs(t, err, &replay)
	assert.Equal(t, body, replay.body)
	assert.Equal(t, int64(1), up.runs.Load(), "never executed twice")

	// Another instance (or after eviction): 409 completed, still no run.
	s.idem = idemCache{}
	_, err = serve(s, ctx, admission{body: chatBody(""), idemKey: "k"})
	ae := statusFor(err)
	assert.Equal(t, 409, ae.Status)
	assert.Equal(t, map[string]any{"state": "completed"}, ae.Details)
	assert.Equal(t, int64(1), up.runs.Load())
}

// outageLedger fails every Reserve as unreachable while down is set.
func outageLedger(t *testing.T) (*fakeLedger, *atomic.Bool) {
	led := newFakeLedger(t)
	var down atomic.Bool
	led.reserve = func(context.Context, ledger.ReserveRequest) (ledger.Grant, error, bool) {
		if down.Load() {
			return ledger.Grant{}, ledger.ErrUnavailable, true
		}
		return ledger.Grant{}, nil, false
	}
	return led, &down
}

const outageTenant = "    outage_allowance: {requests: 10, tokens: 100000}\n    budgets:\n      - {dimension: tokens, limit: 1000000, window: 1h}\n"

// TestBug13_4_OutageKeepsIdempotentID: an owed outage charge under an
// Idempotency-Key's id (left by a process from before keyed requests were
// refused outage admission, see TestChaosIdemRetryNotOutageAdmitted) keeps
// the id: retries during the outage and after it never execute; the usage
// is charged once, under the key's id.
func TestBug13_4_OutageKeepsIdempotentID(t *testing.T) {
	led, down := outageLedger(t)
	up := &fakeUpstream{out: 3}
	s := newTestServer(t, testConfig(t, "", outageTenant), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	tn := s.pol.Load().tenants["acme"]
	ref := ledger.Ref{Tenant: tn.key, ID: s.idemID(tn.key, "k", 0)}
	require.NoError(t, s.outage.put(&outageCharge{Tenant: "acme", ReqID: "old", Source: ledger.SourceFinal,
		Req: ledger.ChargeRequest{Ref: ref, Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: tn.key, Limits: tn.limits}},
			Amounts: ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 5, ledger.OutputTokens: 3, ledger.Tokens: 8}, At: time.Now()}}))
	down.Store(true)
	a := admission{body: chatBody(""), idemKey: "k"}
	for range 3 {
		_, err := serve(s, ctx, a)
		assert.Equal(t, 409, statusFor(err).Status, "a retry during the outage does not run: %v", err)
	}
	down.Store(false)
	s.chargeOutages(ctx)
	assert.Equal(t, 1, led.n("charge"))
	_, err := serve(s, ctx, a)
	assert.Equal(t, 409, statusFor(err).Status, "after the charge the ledger knows the id: %v", err)
	assert.Equal(t, int64(0), up.runs.Load(), "the key never ran again")
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(5+3), committed(u, ledger.Tokens, time.Hour), "charged once at its usage")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestBug13_6_OutageUsagePersisted: outage usage not yet charged survives
// a restart and is billed exactly once; a call still running at the crash
// is billed at its hold.
func TestBug13_6_OutageUsagePersisted(t *testing.T) {
	dir := t.TempDir()
	led, down := outageLedger(t)
	up := &fakeUpstream{out: 3}
	top := fmt.Sprintf("admin: {state_file: %q}\n", dir+"/admin.json")
	cfg := testConfig(t, top, outageTenant)
	s1 := newTestServer(t, cfg, led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s1.dispatchLoop(ctx)
	down.Store(true)
	_, err := serve(s1, ctx, admission{body: chatBody("")})
	require.NoError(t, err)
	// A second call admitted and "running" when the process dies.
	pol := s1.pol.Load()
	c, err := s1.admit(ctx, pol.tenants["acme"], pol, admission{ep: 1, body: chatBody(""), reqID: "crash"})
	require.NoError(t, err)
	require.True(t, c.outage)
	held := c.held[ledger.Tokens]

	// Restart: a new process reads the owed charges.
	down.Store(false)
	s2 := newTestServer(t, cfg, led, up)
	s2.chargeOutages(ctx)
	s2.chargeOutages(ctx)
	s3 := newTestServer(t, cfg, led, up)
	s3.chargeOutages(ctx)
	assert.Equal(t, 2, led.n("charge"), "each owed charge sent once, then dropped")
	u := tenantUsage(t, s2, led.Memory)
	assert.Equal(t, int64(5+3)+held, committed(u, ledger.Tokens, time.Hour), "usage of the finished call plus the hold of the one that died")
}
