package scheduler

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
)

// Regression tests of the violations the seeded fault simulator
// (test/chaos) found on the Redis backend, one per root cause.

// budgets meters acme's tokens and requests; outageBudgets adds an
// outage allowance.
const (
	budgets       = "    budgets:\n      - {dimension: tokens, limit: 1000000, window: 1h}\n      - {dimension: requests, limit: 1000, window: 1h}\n"
	outageBudgets = "    outage_allowance: {requests: 10, tokens: 100000}\n" + budgets
)

// ambiguousLedger fails every Reserve as ErrAmbiguous while down is set,
// applying it first when apply is set (the store ran it, the reply was lost).
func ambiguousLedger(t *testing.T, apply bool) (*fakeLedger, func(bool)) {
	led := newFakeLedger(t)
	down := false
	led.reserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
		if !down {
			return ledger.Grant{}, nil, false
		}
		if apply {
			_, _ = led.Memory.Reserve(ctx, req)
		}
		return ledger.Grant{}, fmt.Errorf("%w: reply lost", ledger.ErrAmbiguous), true
	}
	return led, func(d bool) { led.set(func() { down = d }) }
}

// TestChaosAmbiguousRetryNotReleased (chaos seed 1 on redis: a retry 130
// ms after the first attempt answered 500 ledger_error "request already
// final"): the first attempt's ambiguous Reserve queued a Release by id;
// the retry on the same instance (same owner) then held that id, and the
// Release ended the retry's reservation before its MarkDispatched. An
// ambiguous keyed Reserve is left to its lease; the retry runs, once.
func TestChaosAmbiguousRetryNotReleased(t *testing.T) {
	led, setDown := ambiguousLedger(t, false)
	up := &fakeUpstream{out: 2}
	s := newTestServer(t, testConfig(t, "", budgets), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)

	setDown(true)
	_, err := serve(ctx, s, admission{body: chatBody(""), idemKey: "k"})
	require.Equal(t, 503, apierr.For(err).Status, "%v", err)
	setDown(false)

	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: chatBody(""), idemKey: "k", reqID: "retry"})
	require.NoError(t, err)
	defer c.end()
	s.settler.Flush(ctx) // whatever the first attempt left lands now
	require.NoError(t, s.await(c), "the retry's reservation is its own")
	require.NoError(t, s.execute(c))
	_, err = s.drainStream(c)
	require.NoError(t, err)
	s.finish(c, nil)
	assert.Equal(t, int64(1), up.runs.Load())
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour))
	assert.Equal(t, int64(5+2), committed(u, ledger.Tokens, time.Hour))
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestChaosDispatchFinalIsLeaseLost: a reservation that ended before its
// MarkDispatched (ErrAlreadyFinal: expired or released under the call) is
// 503 ledger_unavailable with nothing sent, never 500 ledger_error.
func TestChaosDispatchFinalIsLeaseLost(t *testing.T) {
	led := newFakeLedger(t)
	led.dispatch = func(context.Context, ledger.Ref) (error, bool) { return ledger.ErrAlreadyFinal, true }
	up := &fakeUpstream{out: 2}
	s := newTestServer(t, testConfig(t, "", budgets), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	for _, key := range []string{"", "k"} {
		_, err := serve(ctx, s, admission{body: chatBody(""), idemKey: key})
		ae := apierr.For(err)
		assert.Equal(t, 503, ae.Status, "key %q: %v", key, err)
		assert.Equal(t, "ledger_unavailable", ae.Code)
	}
	assert.Equal(t, int64(0), up.runs.Load())
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
	assert.Equal(t, int64(0), committed(u, ledger.Requests, time.Hour))
}

// TestChaosOutageChargeOnce: an outage-admitted call whose failed Reserve
// was ambiguous is charged exactly once in every interleaving: the Reserve
// applied or not, its lease expired before the charge or not, and the
// charge retried (a lost reply, a restart) after it landed.
func TestChaosOutageChargeOnce(t *testing.T) {
	for _, tc := range []struct {
		apply, expire bool
	}{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("applied=%v,expired=%v", tc.apply, tc.expire), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				led, setDown := ambiguousLedger(t, tc.apply)
				up := &fakeUpstream{out: 3}
				s := newTestServer(t, testConfig(t, "", outageBudgets), led, up)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go s.dispatchLoop(ctx)
				setDown(true)
				_, err := serve(ctx, s, admission{body: chatBody("")})
				require.NoError(t, err, "admitted on the outage allowance")
				setDown(false)
				owed := s.settler.Chargeable()
				require.Len(t, owed, 1)
				if tc.expire {
					time.Sleep(2 * time.Minute) // past the 60s lease (synctest's clock)
					_, err := led.Reclaim(ctx, s.pol.Load().Tenants["acme"].ScopeKey, 100)
					require.NoError(t, err)
				}
				s.settler.ChargeOutages(ctx)
				require.Empty(t, s.settler.Chargeable())
				// A retry of the same charge (its reply lost, or a restart
				// before the drop persisted) is answered, never charged again.
				s.settler.OweOutage(&owed[0])
				s.settler.ChargeOutages(ctx)
				require.Empty(t, s.settler.Chargeable())
				u := tenantUsage(t, s, led.Memory)
				assert.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour))
				assert.Equal(t, int64(5+3), committed(u, ledger.Tokens, time.Hour))
				assert.Equal(t, ledger.Amounts{}, u.Reserved)
				assert.Equal(t, int64(1), up.runs.Load())
			})
		})
	}
}

// TestChaosRecoveryKicksOutbox (chaos seed 219 on redis: an instance killed
// shortly after a stall had not charged its owed outage usage yet): the
// first ledger answer after store errors wakes the pending-writes log's
// loop at once, so owed charges and pending endings do not wait for the
// next tick; an answer while the ledger was answering wakes nothing.
func TestChaosRecoveryKicksOutbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		led.settle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
		s := newTestServer(t, testConfig(t, "", budgets), led, &fakeUpstream{out: 1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = s.settler.Loop(ctx) }()
		// A pending ending the store keeps refusing: each pass of the loop
		// tries it once, so the Settles sent count the passes.
		s.settler.QueueSettle(ledger.Ref{ID: ledger.NewRequestID()}, ledger.Amounts{}, ledger.SourceNotSent, "pending")
		synctest.Wait()
		require.Equal(t, 1, led.n("settle"), "queued: one pass")
		require.Equal(t, 1, s.settler.Pending())

		s.ledgerErrs.Store(0) // the ledger was answering
		s.noteLedger("reserve", nil)
		synctest.Wait()
		assert.Equal(t, 1, led.n("settle"), "no pass while the ledger was answering")
		s.noteLedger("reserve", ledger.ErrUnavailable)
		s.noteLedger("reserve", ledger.ErrUnavailable)
		synctest.Wait()
		assert.Equal(t, 1, led.n("settle"), "nor on its errors")
		s.noteLedger("reserve", nil)
		synctest.Wait()
		assert.Equal(t, 2, led.n("settle"), "recovery: a pass at once, not at the next tick")
	})
}
