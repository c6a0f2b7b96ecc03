package gate

import (
	"math/bits"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// slots is a pool key for the tests: a bit per replica slot.
type slots uint64

func (k slots) Has(i int) bool { return k&(1<<i) != 0 }
func (k slots) Replicas() int  { return bits.OnesCount64(uint64(k)) }

// TestPoolMoveBalances: a request's pool load follows its spot, a repeated
// move is a no-op, and a tenant's entry goes once it holds nothing.
func TestPoolMoveBalances(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := t0
	p := Pools[slots]{Now: func() time.Time { return clk }}
	k := slots(1 << 1)
	c1 := &Place[slots]{Pool: k}
	c2 := &Place[slots]{Pool: k}
	p.Move(c1, "x", 100, false, SpotQueued)
	p.Move(c2, "x", 30, false, SpotQueued)
	p.Move(c1, "x", 100, false, SpotHeld)
	p.Move(c1, "x", 100, false, SpotHeld)
	assert.Equal(t, t0, c1.HeldAt)
	clk = t0.Add(time.Second)
	pl := p.pools[k]
	assert.Equal(t, poolTenant{held: 1, queued: 1, tokens: 100, arrived: 2}, *pl.tenants["x"])
	p.Move(c1, "x", 100, false, SpotQueued) // a slot denial puts it back: no new arrival
	p.Move(c2, "x", 30, false, SpotHeld)
	clk = t0.Add(3500 * time.Millisecond)
	assert.Equal(t, poolTenant{held: 1, queued: 1, tokens: 30, arrived: 2}, *pl.tenants["x"])
	assert.False(t, pl.idle())
	p.Move(c1, "x", 100, false, SpotNone)
	p.Move(c2, "x", 30, true, SpotNone) // ran upstream: a service time
	p.Move(c2, "x", 30, true, SpotNone)
	assert.Equal(t, poolTenant{arrived: 2, served: 1, servedSec: 2.5}, *pl.tenants["x"])
	assert.Equal(t, SpotNone, c2.Spot)
	assert.True(t, pl.idle())
}

// TestPoolRepoolAndPark: a queued request repooled counts in its new pool
// (an arrival there), one that holds room stays; WaitingOn sums the pools a
// slot is in, and DemandOn spreads each pool's over its replicas; a full pool's parked tenants are handed back once.
func TestPoolRepoolAndPark(t *testing.T) {
	t.Parallel()
	var p Pools[slots]
	a, ab := slots(1), slots(3)
	q := &Place[slots]{Pool: a}
	h := &Place[slots]{Pool: a}
	p.Move(q, "x", 10, false, SpotQueued)
	p.Move(h, "y", 10, false, SpotHeld)
	p.Repool(q, ab, "x", 10)
	p.Repool(h, ab, "y", 10)
	assert.Equal(t, ab, q.Pool)
	assert.Equal(t, a, h.Pool, "holding room: stays where its room is counted")
	assert.Equal(t, TenantLoad{Name: "x", Arrived: 1}, p.Load(a, "x"))
	assert.Equal(t, TenantLoad{Name: "x", Queued: 1, Arrived: 1}, p.Load(ab, "x"))
	assert.Equal(t, int64(1), p.WaitingOn(1), "slot 1 is in ab only")
	assert.Equal(t, int64(1), p.WaitingOn(0))
	assert.Equal(t, int64(0), p.WaitingOn(2))
	type seen struct {
		tenant string
		d      Demand
	}
	var on0 []seen
	p.DemandOn(0, func(tenant string, d Demand) { on0 = append(on0, seen{tenant, d}) })
	assert.Equal(t, []seen{{"x", Demand{Asked: 0.5, Asks: 0.5, Queued: 0.5}}, {"y", Demand{Asked: 1, Asks: 1, Held: 1}}}, on0,
		"x queued on ab's two replicas, y held on a's one; no gate has assessed them")
	var on2 []seen
	p.DemandOn(2, func(tenant string, d Demand) { on2 = append(on2, seen{tenant, d}) })
	assert.Empty(t, on2)

	p.Lock()
	p.ParkFullLocked(ab, "x")
	p.ParkFullLocked(ab, "x")
	p.ParkFullLocked(a, "y")
	p.Unlock()
	assert.Equal(t, []string{"x"}, p.UnparkFull(ab))
	assert.Empty(t, p.UnparkFull(ab))
	assert.Equal(t, []string{"y"}, p.UnparkAll())
	assert.Empty(t, p.UnparkAll())
}

// TestDemandOnStands: DemandOn says which tenants the pool's gate lets
// through with a standing queue (Gate.Stands), and what each holds, for
// the share split.
func TestDemandOnStands(t *testing.T) {
	t.Parallel()
	var p Pools[slots]
	k := slots(1)
	for range 3 {
		p.Move(&Place[slots]{Pool: k}, "loop", 10, false, SpotHeld)
	}
	p.Move(&Place[slots]{Pool: k}, "loop", 10, false, SpotQueued)
	p.Move(&Place[slots]{Pool: k}, "light", 10, false, SpotHeld)
	p.Lock()
	standingLoop(t, &p.PoolLocked(k).Gate, 3)
	p.Unlock()
	stands, held := map[string]bool{}, map[string]float64{}
	p.DemandOn(0, func(tenant string, d Demand) { stands[tenant], held[tenant] = d.Stands, d.Held })
	assert.Equal(t, map[string]bool{"loop": true, "light": false}, stands)
	assert.Equal(t, map[string]float64{"loop": 3, "light": 1}, held, "the part of its claim in flight")
}

// TestPoolCountsARefusedArrival: the engine counts a request queued in its
// pool before Enqueue and moves it out when the queue refuses it
// (queue_full); it stays an arrival, so a flood whose queue is full reads
// at the rate it sends, not the rate it is admitted (the gate's sustained
// test, SCHEDULING §6 "A burst is not a flood").
func TestPoolCountsARefusedArrival(t *testing.T) {
	t.Parallel()
	var p Pools[slots]
	k := slots(1)
	c := &Place[slots]{Pool: k}
	p.Move(c, "x", 100, false, SpotQueued)
	p.Move(c, "x", 100, false, SpotNone) // refused by the queue
	assert.Equal(t, TenantLoad{Name: "x", Arrived: 1}, p.Load(k, "x"))
}

// TestQueuedBesides: another tenant with requests queued on the pool
// counts where usable says so; the asking tenant and tenants that only
// hold room do not (lifecycle's othersMayUse).
func TestQueuedBesides(t *testing.T) {
	t.Parallel()
	var p Pools[slots]
	k := slots(1)
	p.Move(&Place[slots]{Pool: k}, "flood", 10, false, SpotQueued)
	p.Move(&Place[slots]{Pool: k}, "holder", 10, false, SpotHeld)
	pl := p.PoolLocked(k)
	all := func(string) bool { return true }
	assert.False(t, pl.QueuedBesides("flood", all), "the holder queues nothing")
	p.Move(&Place[slots]{Pool: k}, "light", 10, false, SpotQueued)
	assert.True(t, pl.QueuedBesides("flood", all))
	assert.False(t, pl.QueuedBesides("flood", func(n string) bool { return n != "light" }), "not usable")
	assert.True(t, pl.QueuedBesides("light", all), "the flood, for the light tenant")
}

// TestPoolAssessSetsTheMargin: Pool.Assess hands the gate
// server.reserve_margin as it is now (a reload applies it), 0 meaning no
// margin, not the gate's default.
func TestPoolAssessSetsTheMargin(t *testing.T) {
	t.Parallel()
	var p Pools[slots]
	k := slots(1)
	p.Move(&Place[slots]{Pool: k}, "x", 10, false, SpotQueued)
	pl := p.PoolLocked(k)
	one := func(int) (string, float64) { return "x", 1 }
	for _, tc := range []struct{ margin, want float64 }{{3, 3}, {0, -1}, {BurstK, BurstK}} {
		pl.Assess(1, "x", 1, one, FleetLoad{SeqsCap: 4, TokensCap: 1 << 20}, 0, 0, 0, tc.margin, 1)
		assert.Equal(t, tc.want, pl.Gate.Margin, "margin %v", tc.margin)
		assert.Equal(t, max(tc.margin, 0), pl.Gate.burstK())
	}
}
