package scheduler

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// With room free, a call is dispatched by its own admit (no dispatch loop
// runs here), exactly once, and settles once.
func TestInlineDispatchWithoutLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 2}
		s := newTestServer(t, testConfig(t, "", ""), led, up)
		s.loopOnly = false
		body, err := serve(s, context.Background(), admission{body: chatBody("")})
		require.NoError(t, err)
		assert.NotEmpty(t, body)
		assert.Equal(t, int64(1), up.runs.Load())
		assert.Equal(t, 1, led.n("dispatch"))
		assert.Equal(t, 1, led.n("settle"))
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
	})
}

// The inline pass asks the loop's predicate: a tenant at its concurrency
// stays queued until a completion lets the loop dispatch it.
func TestInlineDispatchKeepsTheGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		gate := make(chan struct{})
		up := &fakeUpstream{out: 2, gate: gate}
		s := newTestServer(t, testConfig(t, "", "    concurrency: 1\n"), led, up)
		s.loopOnly = false
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		errs := make(chan error, 2)
		for range 2 {
			go func() { _, err := serve(s, context.Background(), admission{body: chatBody("")}); errs <- err }()
			synctest.Wait()
		}
		assert.Equal(t, int64(1), up.runs.Load(), "one running, at the tenant's concurrency")
		st, ok := s.q.Stats("acme")
		require.True(t, ok)
		assert.Equal(t, 1, st.Depth, "the second waits in the queue")
		close(gate)
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		assert.Equal(t, int64(2), up.runs.Load())
		assert.Equal(t, 2, led.n("settle"))
	})
}
