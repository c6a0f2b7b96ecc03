package scheduler

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/scheduler/peers"
)

// TestReplicaLeavesAfterItsRequests: a replica that joins is routed to; once
// it leaves no choice picks it, while the request holding room there keeps
// it until that request leaves; only then is it removed, from the set and
// the GPU monitor. Its pool slot is reused by the next replica to join.
func TestReplicaLeavesAfterItsRequests(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	require.NoError(t, s.AddReplica(config.Replica{Name: "r1", URL: "http://r1.invalid", MaxNumSeqs: 8}))
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1000, "r1": 1000, "r2": 1000})
	r1 := s.reps.Get("r1")
	require.NotNil(t, r1)
	assert.Equal(t, 1, r1.Slot)
	_, known := s.gpu.Snapshot().Replica("r1")
	assert.True(t, known, "the GPU monitor sizes it")

	// r0 carries load: r1, empty, wins.
	s.reps.List()[0].Load.Store(500)
	rep, seq := s.reps.Take(fleet.Route{}, 100, nil)
	require.Equal(t, "r1", rep.Name, "a replica that joined takes requests")

	require.NoError(t, s.RemoveReplica("r1", "test"))
	for range 5 {
		next, _ := s.reps.Take(fleet.Route{}, 100, nil)
		require.NotNil(t, next)
		assert.NotEqual(t, "r1", next.Name, "a replica that left gets no new request")
		s.reps.Release(next, 100)
	}
	assert.Empty(t, s.ReapReplicas(), "not removed while a request holds room there")
	assert.NotNil(t, s.reps.Get("r1"))

	s.reps.Leave(r1, 100, seq, false, time.Now())
	assert.Equal(t, []string{"r1"}, s.ReapReplicas())
	assert.Nil(t, s.reps.Get("r1"))
	_, known = s.gpu.Snapshot().Replica("r1")
	assert.False(t, known, "removed from the GPU monitor")

	require.NoError(t, s.AddReplica(config.Replica{Name: "r2", URL: "http://r2.invalid", MaxNumSeqs: 8}))
	assert.Equal(t, 1, s.reps.Get("r2").Slot, "the free slot is reused")
	var both fleet.PoolKey
	both.Set(0)
	both.Set(1)
	assert.Equal(t, both, s.reps.PoolKeyOf("m"), "nothing known: one pool of both members")
}

// TestReplicaComesBackWhileLeaving: a replica listed again before it was
// removed is routed to again; with another URL under its name it is
// refused until the old one is gone.
func TestReplicaComesBackWhileLeaving(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	rc := config.Replica{Name: "r1", URL: "http://r1.invalid", MaxNumSeqs: 8}
	require.NoError(t, s.AddReplica(rc))
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1000, "r1": 1000})
	r1 := s.reps.Get("r1")
	_, _ = s.reps.Take(fleet.Route{}, 100, nil) // room held: not reaped
	r1.Count.Store(1)
	require.NoError(t, s.RemoveReplica("r1", "test"))
	assert.False(t, s.reps.Up(r1))
	moved := rc
	moved.URL = "http://elsewhere.invalid"
	assert.Error(t, s.AddReplica(moved))
	require.NoError(t, s.AddReplica(rc))
	assert.True(t, s.reps.Up(r1), "back in the choice")
	assert.Same(t, r1, s.reps.Get("r1"))
	assert.Empty(t, s.ReapReplicas())
}

// TestShareLoopFollowsMembers: a replica that joins while the demand
// exchange runs is reported and capped under its own key from the next
// exchange on. It serves a model of its own, so it is a pool of one, where
// the heavy tenants keep a sequence (fleet.SplitPool).
func TestShareLoopFollowsMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
		ex := &fakeExchange{}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.ShareLoop(ctx, ex) }()
		time.Sleep(shareInterval)
		synctest.Wait()

		require.NoError(t, s.AddReplica(config.Replica{Name: "r1", URL: "http://r1.invalid", MaxNumSeqs: 4, Models: []string{"joined"}}))
		r1 := s.reps.Get("r1")
		r1.Count.Store(4)
		ex.set(map[string][]peers.Entry{r1.URL: {{Instance: "other", InFlight: 4, Queued: 4}}}, nil)
		time.Sleep(shareInterval)
		synctest.Wait()
		ex.mu.Lock()
		assert.Equal(t, []peers.Report{{Replica: r1.URL, InFlight: 4}}, ex.reports[len(ex.reports)-1])
		ex.mu.Unlock()
		assert.Equal(t, int64(3), r1.Share.Load(), "the joined replica's four less the backlogged other's floor")
		cancel()
		require.NoError(t, <-done)
	})
}
