package lifecycle

import (
	"context"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

func TestLifecycleTransitions(t *testing.T) {
	t.Parallel()
	c := &call{}
	for _, p := range []phase{phaseReserved, phaseQueued, phaseDispatched, phaseStreaming, phaseSettled} {
		require.NoError(t, c.to(p))
	}
	for p := range numPhases {
		require.Error(t, c.to(p), "a terminal phase has no way out (%s)", p)
	}
	c = &call{phase: phaseQueued}
	require.Error(t, c.to(phaseStreaming), "no streaming without a slot")
	require.Error(t, c.to(phaseSettled), "a queued call is released, never settled")
	assert.NoError(t, c.to(phaseReleased))
}

// TestFinishAndReleaseRunOnce: a call's ending touches the ledger once,
// however many paths try to end it.
func TestFinishAndReleaseRunOnce(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &lifecycletest.Upstream{Out: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: vllm.EndpointChat, body: lifecycletest.ChatBody(""), reqID: "a"})
	require.NoError(t, err)
	assert.Equal(t, phaseQueued, c.phase)
	require.NoError(t, s.await(c))
	assert.Equal(t, phaseDispatched, c.phase)
	require.NoError(t, s.execute(c))
	assert.Equal(t, phaseStreaming, c.phase)
	_, err = s.drainStream(c)
	require.NoError(t, err)
	var illegal []error
	s.onIllegal = func(err error) { illegal = append(illegal, err) }
	s.finish(c, nil)
	s.finish(c, apierr.ErrClientGone) // an ended call's finish is a no-op
	s.release(c)                      // a settled call released: a bug, counted
	c.end()
	assert.Equal(t, phaseSettled, c.phase)
	require.Len(t, illegal, 1)
	assert.Equal(t, transitionError{phaseSettled, phaseReleased}, illegal[0])
	var m dto.Metric
	require.NoError(t, s.m.IllegalMoves.Write(&m))
	assert.InDelta(t, 1.0, m.GetCounter().GetValue(), 0, "sluice_lifecycle_illegal_transitions_total")
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, 0, led.N("release"))
	assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
}

// TestCallEndsInFinish: a call whose client leaves while it is queued
// leaves the queue in Start, but keeps its reservation until Finish, the
// one place a call ends, gives it back (once).
func TestCallEndsInFinish(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &lifecycletest.Upstream{Out: 2})
	ctx, cancel := context.WithCancelCause(context.Background())
	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: vllm.EndpointChat, body: lifecycletest.ChatBody(""), reqID: "a"})
	require.NoError(t, err)
	cancel(apierr.ErrClientGone) // no dispatch loop runs: the call stays queued
	tk := &Ticket{e: s, c: c, err: s.await(c)}
	require.ErrorIs(t, tk.err, apierr.ErrClientGone)
	assert.Equal(t, phaseQueued, c.phase, "out of the queue, not ended")
	assert.Zero(t, led.N("release"))
	assert.NotZero(t, tenantUsage(t, s, led.Memory).Reserved[ledger.Tokens], "still reserved")

	var out recordingSink
	tk.Finish(&out)
	assert.ErrorIs(t, out.err, apierr.ErrClientGone)
	assert.Equal(t, phaseReleased, c.phase)
	assert.Equal(t, 1, led.N("release"))
	assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
}
