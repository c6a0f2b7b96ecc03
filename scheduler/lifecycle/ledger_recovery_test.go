package lifecycle

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
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
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
func ambiguousLedger(t *testing.T, apply bool) (*lifecycletest.Ledger, func(bool)) {
	led := lifecycletest.NewLedger(t)
	down := false
	led.OnReserve = func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool) {
		if !down {
			return ledger.Grant{}, nil, false
		}
		if apply {
			_, _ = led.Memory.Reserve(ctx, req)
		}
		return ledger.Grant{}, fmt.Errorf("%w: reply lost", ledger.ErrAmbiguous), true
	}
	return led, func(d bool) { led.Set(func() { down = d }) }
}

// TestChaosAmbiguousRetryNotReleased (chaos seed 1 on redis: a retry 130
// ms after the first attempt answered 500 ledger_error "request already
// final"): the first attempt's ambiguous Reserve queued a Release by id;
// the retry on the same instance (same owner) then held that id, and the
// Release ended the retry's reservation before its MarkDispatched. An
// ambiguous keyed Reserve is left to its lease; the retry runs, once.
func TestChaosAmbiguousRetryNotReleased(t *testing.T) {
	led, setDown := ambiguousLedger(t, false)
	up := &lifecycletest.Upstream{Out: 2}
	s := newTestEngine(t, lifecycletest.Config(t, "", budgets), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)

	setDown(true)
	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
	require.Equal(t, 503, apierr.For(err).Status, "%v", err)
	setDown(false)

	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: lifecycletest.ChatBody(""), idemKey: "k", reqID: "retry"})
	require.NoError(t, err)
	defer c.end()
	s.settler.Flush(ctx) // whatever the first attempt left lands now
	require.NoError(t, s.await(c), "the retry's reservation is its own")
	require.NoError(t, s.execute(c))
	_, err = s.drainStream(c)
	require.NoError(t, err)
	s.finish(c, nil)
	assert.Equal(t, int64(1), up.Runs.Load())
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
	assert.Equal(t, int64(5+2), lifecycletest.Committed(u, ledger.Tokens, time.Hour))
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestChaosDispatchFinalIsLeaseLost: a reservation that ended before its
// MarkDispatched (ErrAlreadyFinal: expired or released under the call) is
// 503 ledger_unavailable with nothing sent, never 500 ledger_error.
func TestChaosDispatchFinalIsLeaseLost(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	led.OnDispatch = func(context.Context, ledger.Ref) (error, bool) { return ledger.ErrAlreadyFinal, true }
	up := &lifecycletest.Upstream{Out: 2}
	s := newTestEngine(t, lifecycletest.Config(t, "", budgets), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	for _, key := range []string{"", "k"} {
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: key})
		ae := apierr.For(err)
		assert.Equal(t, 503, ae.Status, "key %q: %v", key, err)
		assert.Equal(t, "ledger_unavailable", ae.Code)
	}
	assert.Equal(t, int64(0), up.Runs.Load())
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
	assert.Equal(t, int64(0), lifecycletest.Committed(u, ledger.Requests, time.Hour))
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
				up := &lifecycletest.Upstream{Out: 3}
				s := newTestEngine(t, lifecycletest.Config(t, "", outageBudgets), led, up)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go s.dispatchLoop(ctx)
				setDown(true)
				_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
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
				assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
				assert.Equal(t, int64(5+3), lifecycletest.Committed(u, ledger.Tokens, time.Hour))
				assert.Equal(t, ledger.Amounts{}, u.Reserved)
				assert.Equal(t, int64(1), up.Runs.Load())
			})
		})
	}
}
