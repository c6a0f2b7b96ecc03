package fleet_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/fleet"
)

func newQueue(t *testing.T, clk queue.Clock, tenants ...queue.TenantConfig) *queue.Queue[int] {
	t.Helper()
	q, err := queue.New[int](queue.Config{Tenants: tenants, MaxWait: time.Hour, IdleTTL: -1}, queue.Deps[int]{Clock: clk})
	require.NoError(t, err)
	return q
}

func apply(t *testing.T, q *queue.Queue[int], res fleet.Result) {
	t.Helper()
	for _, a := range res.Adjust {
		require.True(t, q.AdjustFleet(a.Tenant, a.Band, a.Service, a.Lifted))
	}
	q.SetFleetFloors(res.Floor, res.HasFloor)
}

func counter(t *testing.T, q *queue.Queue[int], tenant string) float64 {
	t.Helper()
	v, ok := q.Counter(tenant, 0)
	require.True(t, ok)
	return v
}

// TestMergeAddsGrowthOnce: another instance's service is added once, as
// growth (refunds lower it); a flow created again there (its Gen changed)
// counts from 0; an instance that stops reporting keeps its service
// counted and, reporting again, adds only its growth; the largest lifted
// is adopted; tenants unknown here are skipped.
func TestMergeAddsGrowthOnce(t *testing.T) {
	clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	q := newQueue(t, clk, queue.TenantConfig{Name: "a", Weight: 2}, queue.TenantConfig{Name: "b"})
	var m fleet.Merger
	merge := func(others map[string][]fleet.Flow) {
		apply(t, q, m.Merge(clk.now, q.AppendFlows(nil), q.Weight, others))
	}
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 100, Gen: 1}, {Tenant: "ghost", Service: 9}}})
	assert.Equal(t, 50.0, counter(t, q, "a"), "100 over weight 2")
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 100, Gen: 1}}})
	assert.Equal(t, 50.0, counter(t, q, "a"), "the same report adds nothing")
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 80, Gen: 1}}})
	assert.Equal(t, 40.0, counter(t, q, "a"), "a refund there")
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 10, Gen: 2}}})
	assert.Equal(t, 45.0, counter(t, q, "a"), "a new flow there: its 10 counts, the old 80 stays")
	merge(nil)
	assert.Equal(t, 45.0, counter(t, q, "a"), "x stopped reporting: its service stays")
	clk.now = clk.now.Add(time.Minute)
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 30, Gen: 2}}})
	assert.Equal(t, 55.0, counter(t, q, "a"), "x back: only its growth")
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 30, Gen: 2, Lifted: 500}}, "y": {{Tenant: "a", Lifted: 200}}})
	assert.Equal(t, 555.0, counter(t, q, "a"), "the largest lifted, adopted once")
	merge(map[string][]fleet.Flow{"x": {{Tenant: "a", Service: 30, Gen: 2, Lifted: 500}}, "y": {{Tenant: "a", Lifted: 500}}})
	assert.Equal(t, 555.0, counter(t, q, "a"), "the same lift made elsewhere too: not twice")
	st := q.AppendFlows(nil)
	require.Len(t, st, 1, "no flow for b yet, none for the ghost")
	assert.Equal(t, 500.0, st[0].Lifted)
	assert.Zero(t, st[0].Charged, "others' service is not this instance's")
}

// TestFleetFloorKeepsBusyTenantsCounter: a tenant backlogged at another
// instance is not idle, so when it arrives here it keeps its counter
// instead of being lifted to this instance's minimum (which would charge
// it for service it never had); a tenant idle everywhere is lifted to the
// fleet's floor. Without a floor (local fallback) both are lifted.
func TestFleetFloorKeepsBusyTenantsCounter(t *testing.T) {
	for _, fleetWide := range []bool{true, false} {
		clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		q := newQueue(t, clk, queue.TenantConfig{Name: "busy"}, queue.TenantConfig{Name: "idle"}, queue.TenantConfig{Name: "local"})
		// local has been served 1000 here and is backlogged here.
		for range 2 {
			_, err := q.Enqueue(queue.Request[int]{Tenant: "local", Cost: 500})
			require.NoError(t, err)
		}
		it, ok := q.Next(func(queue.Item[int]) queue.Verdict { return queue.Dispatch })
		require.True(t, ok)
		q.Release(it.Handle)
		it, ok = q.Next(func(queue.Item[int]) queue.Verdict { return queue.Dispatch })
		require.True(t, ok)
		q.Release(it.Handle)
		_, err := q.Enqueue(queue.Request[int]{Tenant: "local", Cost: 500})
		require.NoError(t, err)
		// busy was served 300 at x and is backlogged there; idle 200, not backlogged.
		var m fleet.Merger
		res := m.Merge(clk.now, q.AppendFlows(nil), q.Weight, map[string][]fleet.Flow{"x": {
			{Tenant: "busy", Service: 300, Backlogged: true}, {Tenant: "idle", Service: 200}}})
		if !fleetWide {
			res.HasFloor = [queue.NumBands]bool{}
		}
		apply(t, q, res)
		for _, tn := range []string{"busy", "idle"} {
			_, err := q.Enqueue(queue.Request[int]{Tenant: tn, Cost: 1})
			require.NoError(t, err)
		}
		if fleetWide {
			assert.Equal(t, 300.0, counter(t, q, "busy"), "backlogged elsewhere: keeps its counter")
			assert.Equal(t, 300.0, counter(t, q, "idle"), "idle everywhere: lifted to the fleet's floor (busy's)")
		} else {
			assert.Equal(t, 1000.0, counter(t, q, "busy"), "local: lifted to this instance's minimum")
			assert.Equal(t, 1000.0, counter(t, q, "idle"))
		}
	}
}

// TestParkedIsNotCompeting: a tenant parked here (at a cap) is reported
// as not competing, so that it does not hold the fleet's floor down and,
// as on one instance, is lifted when it rejoins.
func TestParkedIsNotCompeting(t *testing.T) {
	clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	q := newQueue(t, clk, queue.TenantConfig{Name: "a"})
	_, err := q.Enqueue(queue.Request[int]{Tenant: "a", Cost: 1})
	require.NoError(t, err)
	require.True(t, q.AppendFlows(nil)[0].Backlogged)
	_, ok := q.Next(func(queue.Item[int]) queue.Verdict { return queue.Park })
	require.False(t, ok)
	assert.False(t, q.AppendFlows(nil)[0].Backlogged, "parked")
	q.Unpark("a")
	assert.True(t, q.AppendFlows(nil)[0].Backlogged)
}
