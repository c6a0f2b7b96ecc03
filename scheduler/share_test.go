package scheduler

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/scheduler/peers"
)

// fakeExchange is a peerExchange whose answers the test sets.
type fakeExchange struct {
	mu      sync.Mutex
	answer  map[string][]peers.Entry
	err     error
	reports [][]peers.Report
	left    bool
}

func (f *fakeExchange) ID() string { return "self" }

func (f *fakeExchange) Key(url string) string { return url }

func (f *fakeExchange) Exchange(_ context.Context, r []peers.Report) (map[string][]peers.Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, r)
	if f.err != nil {
		return nil, f.err
	}
	return f.answer, nil
}

func (f *fakeExchange) Leave(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = true
	return nil
}

func (f *fakeExchange) set(answer map[string][]peers.Entry, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer, f.err = answer, err
}

// TestShareLoop: the loop reports this instance's demand, caps a replica
// others report on, lifts the cap when the exchange has failed for
// ShareStale, and withdraws at the end.
func TestShareLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
		r1 := s.reps.List()[0]
		r1.MaxSeqs = 4
		// r2 serves another model: r1 is a pool of its own, where the
		// heavy tenants keep a sequence (fleet.SplitPool).
		r2 := &fleet.Replica{Name: "r1", URL: "http://r1.invalid", MaxSeqs: 4, Slot: 1, Pinned: []string{"other"}}
		s.reps.SetMembers(append(slices.Clone(s.reps.List()), r2))
		ex := &fakeExchange{}
		ex.set(map[string][]peers.Entry{r1.URL: {{Instance: "other", InFlight: 4, Queued: 3}}}, nil)
		r1.Count.Store(4)
		r2.Count.Store(1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.ShareLoop(ctx, ex) }()

		time.Sleep(shareInterval)
		synctest.Wait()
		// This instance asks its four, within the max-min level: light; the
		// other asks seven, past the batch: heavy. The light claim is given
		// with a margin (4 + √4 = 6), the heavy one keeps one sequence.
		assert.Equal(t, int64(3), r1.Share.Load(), "r1's four less the heavy one's floor")
		assert.Equal(t, int64(1), r1.Peers.Load())
		assert.Equal(t, int64(0), r2.Share.Load(), "nobody else on r2")
		ex.mu.Lock()
		require.NotEmpty(t, ex.reports)
		assert.Equal(t, []peers.Report{{Replica: r1.URL, InFlight: 4}, {Replica: r2.URL, InFlight: 1}}, ex.reports[0], "only where there is demand")
		ex.mu.Unlock()

		// A tenant's demand is reported by tenant too, a pool's spread over
		// its replicas: three queued on the pool of both is 1.5 on each,
		// all of it queued.
		var both fleet.PoolKey
		both.Set(r1.Slot)
		both.Set(r2.Slot)
		places := make([]gate.Place[fleet.PoolKey], 3)
		for i := range places {
			places[i].Pool = both
			s.Pools().Move(&places[i], "acme", 10, false, gate.SpotQueued)
		}
		time.Sleep(shareInterval)
		synctest.Wait()
		ex.mu.Lock()
		acme := []peers.TenantDemand{{Tenant: "acme", Weight: 1, Load: 1500, Claim: 1500, Queued: 1500}}
		assert.Equal(t, []peers.Report{{Replica: r1.URL, InFlight: 4, Queued: 3, Tenants: acme}, {Replica: r2.URL, InFlight: 1, Queued: 3, Tenants: acme}},
			ex.reports[len(ex.reports)-1])
		ex.mu.Unlock()
		assert.Equal(t, int64(3), r1.Share.Load(), "acme's 1.5, light, and a margin of √1.5: 2.7 of r1's four, the larger fraction")
		for i := range places {
			s.Pools().Move(&places[i], "acme", 10, false, gate.SpotNone)
		}
		time.Sleep(shareInterval)
		synctest.Wait()
		assert.Equal(t, int64(3), r1.Share.Load())

		// The cap binds own requests only: with three in flight here r1 has
		// no room for this instance, though the batch has four slots.
		r1.Count.Store(3)
		assert.Equal(t, int64(3), r1.SeqLimit(3))
		r1.Count.Store(0)
		r2.Count.Store(0)

		ex.set(nil, errors.New("store down"))
		time.Sleep(ShareStale - shareInterval)
		synctest.Wait()
		assert.Equal(t, int64(3), r1.Share.Load(), "kept while the news is fresh enough")
		time.Sleep(2 * shareInterval)
		synctest.Wait()
		assert.Equal(t, int64(0), r1.Share.Load(), "lapsed: no news for ShareStale")

		cancel()
		require.NoError(t, <-done)
		assert.True(t, ex.left)
	})
}

// TestTenantsOnQueuedWithinConcurrency: a tenant's queued part counts
// only what its concurrency lets start; the rest waits for its own
// requests, not for the replica's room.
func TestTenantsOnQueuedWithinConcurrency(t *testing.T) {
	s := newTestServer(t, lifecycletest.Config(t, "", "    concurrency: 2\n"), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	r := acmeOnReplica(s, gate.SpotQueued, gate.SpotQueued, gate.SpotQueued)
	rt := s.pol.Load().Tenants["acme"].RT
	for _, c := range []struct{ inflight, queued int64 }{{0, 2000}, {1, 1000}, {2, 0}, {3, 0}} {
		rt.Inflight.Store(c.inflight)
		got := s.tenantsOn(r.Slot, nil)
		require.Len(t, got, 1)
		assert.Equal(t, c.queued, got[0].Queued, "%d in flight of 2", c.inflight)
		assert.Equal(t, int64(3000), got[0].Claim, "what it asks is unchanged")
	}
	rt.Inflight.Store(0)
}

// TestTenantsOnHeldAndReserve: each tenant's report says what it holds of
// its claim (server.reserve_cap bounds the rest in the split), and the
// split takes server.reserve_margin, headroom and reserve_cap as they
// are, reloads included.
func TestTenantsOnHeldAndReserve(t *testing.T) {
	s := newTestServer(t, lifecycletest.Config(t, "server: {reserve_margin: 1, reserve_cap: 0.3}\n", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	r := acmeOnReplica(s, gate.SpotHeld, gate.SpotHeld, gate.SpotQueued)
	got := s.tenantsOn(r.Slot, nil)
	require.Len(t, got, 1)
	assert.Equal(t, int64(2000), got[0].Held)
	assert.Equal(t, int64(3000), got[0].Claim)
	assert.False(t, got[0].Steady, "never assessed")
	assert.Equal(t, fleet.Reserve{Margin: 1, Headroom: 0.1, Cap: 0.3}, s.shareReserve())
	require.NoError(t, s.Reload(lifecycletest.Config(t, "", "")))
	assert.Equal(t, fleet.DefaultReserve, s.shareReserve(), "the defaults")
}

// acmeOnReplica counts a request of tenant acme at each of spots in the
// pool of the server's first replica alone, and returns that replica.
func acmeOnReplica(s *Server, spots ...gate.Spot) *fleet.Replica {
	r := s.reps.List()[0]
	var key fleet.PoolKey
	key.Set(r.Slot)
	for _, spot := range spots {
		s.Pools().Move(&gate.Place[fleet.PoolKey]{Pool: key}, "acme", 10, false, spot)
	}
	return r
}
