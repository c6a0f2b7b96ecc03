package scheduler

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A background loop that ends early fails readiness, naming itself; one
// that ends because its context did is a clean stop.
func TestSuperviseFailsReadiness(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, testConfig(t, "", ""), newFakeLedger(t), &fakeUpstream{})
	s.reps.list()[0].obs.Store(&replicaObs{ok: true})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := s.Supervise(ctx, "quiet", func(ctx context.Context) error { cancel(); return ctx.Err() })
	require.NoError(t, stopped())
	ok, _ := s.Ready()
	assert.True(t, ok, "a loop stopped by its context is not a failure")

	failed := s.Supervise(context.Background(), "poller", func(context.Context) error { return errors.New("scrape client gone") })
	err := failed()
	require.ErrorContains(t, err, "poller loop: scrape client gone")
	ok, why := s.Ready()
	assert.False(t, ok)
	assert.Contains(t, why, "poller loop")
}
