package scheduler

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
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
	led := newFakeLedger(t)
	s := newTestServer(t, testConfig(t, "", ""), led, &fakeUpstream{out: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	c, err := s.admit(ctx, pol.tenants["acme"], pol, admission{ep: vllm.EndpointChat, body: chatBody(""), reqID: "a"})
	require.NoError(t, err)
	assert.Equal(t, phaseQueued, c.phase)
	require.NoError(t, s.await(c))
	assert.Equal(t, phaseDispatched, c.phase)
	require.NoError(t, s.execute(c))
	assert.Equal(t, phaseStreaming, c.phase)
	_, err = s.drainStream(c)
	require.NoError(t, err)
	s.finish(c, nil)
	s.finish(c, ErrClientGone)
	s.release(c)
	c.end()
	assert.Equal(t, phaseSettled, c.phase)
	assert.Equal(t, 1, led.n("settle"))
	assert.Equal(t, 0, led.n("release"))
	assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
}
