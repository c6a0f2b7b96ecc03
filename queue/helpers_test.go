package queue

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// manualClock is a Clock that moves only when told to.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *manualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func always(Item[int]) Verdict { return Dispatch }

func tenants(names ...string) []TenantConfig {
	ts := make([]TenantConfig, len(names))
	for i, n := range names {
		ts[i] = TenantConfig{Name: n}
	}
	return ts
}

func newTestQueue(t *testing.T, cfg Config, clk Clock) *Queue[int] {
	t.Helper()
	q, err := New[int](cfg, Deps[int]{Clock: clk})
	require.NoError(t, err)
	return q
}

func mustEnqueue(t *testing.T, q *Queue[int], r Request[int]) Item[int] {
	t.Helper()
	it, err := q.Enqueue(r)
	require.NoError(t, err)
	return it
}

// next dispatches and releases one entry, failing the test if none comes.
func next(t *testing.T, q *Queue[int], pred func(Item[int]) Verdict) Item[int] {
	t.Helper()
	it, ok := q.Next(pred)
	require.True(t, ok, "Next returned nothing")
	require.True(t, q.Release(it.Handle))
	return it
}

// checkInvariants verifies the queue's internal bookkeeping.
func checkInvariants[T any](t *testing.T, q *Queue[T]) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	depth, bytes := 0, int64(0)
	for _, tn := range q.tenants {
		td, tb := 0, int64(0)
		for b, f := range tn.flows {
			if f == nil {
				continue
			}
			td += f.entries.len()
			for i, e := range f.entries.s {
				n := e.p
				require.Equal(t, i, n.fidx)
				require.Equal(t, entryKey(n), e.k)
				require.Equal(t, stateQueued, n.state)
				tb += n.bytes
			}
			eligible := f.entries.len() > 0 && !tn.parked
			hidx := int(q.fpos[f.id])
			require.Equal(t, eligible, hidx >= 0, "tenant %s band %d eligibility", tn.cfg.Name, b)
			if hidx >= 0 {
				require.Same(t, f, q.bands[b].heap.s[hidx].p)
				require.Equal(t, f.id, q.bands[b].heap.s[hidx].x)
				require.Equal(t, f.v, q.bands[b].heap.s[hidx].k) //nolint:testifylint // exact copy
			}
		}
		require.Equal(t, tn.depth, td, "tenant %s depth", tn.cfg.Name)
		require.Equal(t, tn.bytes, tb, "tenant %s bytes", tn.cfg.Name)
		depth += td
		bytes += tb
	}
	require.Equal(t, q.depth, depth)
	require.Equal(t, q.bytes, bytes)
	require.Equal(t, q.depth, q.deadlines.len())
	for i, e := range q.deadlines.s {
		require.Equal(t, int32(i), q.dpos[e.p.id])
		require.Equal(t, e.p.id, e.x)
		require.Equal(t, e.p.dl, e.k)
	}
}
