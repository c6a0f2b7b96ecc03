package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// choose is take without the seq: what the replica choice tests read.
func (s *replicaSet) choose(rt fleet.Route, size int64, exclude *fleet.Replica) *fleet.Replica {
	r, _ := s.Take(rt, size, exclude)
	return r
}

func TestReplicaPools(t *testing.T) {
	t.Parallel()
	a := &fleet.Replica{Name: "a", MaxSeqs: 8}
	b := &fleet.Replica{Name: "b", MaxSeqs: 8}
	c := &fleet.Replica{Name: "c", MaxSeqs: 8, Pinned: []string{"small", "lora"}}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000, "c": 1000}), []*fleet.Replica{a, b, c}...)

	// c's config list stands in until /v1/models answers; a and b are
	// unknown and, being up, keep unknown models from being a 404.
	assert.Equal(t, []*fleet.Replica{c}, set.Pool("small"))
	assert.True(t, set.KnowsModel("big"), "a and b have not listed their models yet")

	a.Obs.Store(&fleet.Obs{OK: true, Models: []string{"big"}})
	b.Obs.Store(&fleet.Obs{OK: true, Models: []string{"big"}})
	c.Obs.Store(&fleet.Obs{OK: true, Models: []string{"small", "lora", "other"}, Parents: map[string]string{"lora": "small"}})
	assert.False(t, set.KnowsModel("other"), "config restricts c to small and lora")
	assert.False(t, set.KnowsModel("nope"))
	assert.Equal(t, "big", set.DefaultModel())
	assert.Equal(t, []*fleet.Replica{a, b}, set.Pool(""), "no model: vLLM's default, the first replica's first model")

	for range 10 {
		r := set.choose(fleet.Route{Model: "big"}, 10, nil)
		require.NotNil(t, r)
		assert.NotEqual(t, c, r)
	}
	assert.Equal(t, int64(100), a.Load.Load()+b.Load.Load())
	assert.Equal(t, int64(50), a.Load.Load(), "least load within the pool")
	assert.Equal(t, c, set.choose(fleet.Route{Model: "lora"}, 990, nil))
	assert.Nil(t, set.choose(fleet.Route{Model: "small"}, 20, nil), "c is full; a and b do not serve small")
	assert.Equal(t, int64(1000), set.MaxCapacity("small"))

	assert.Equal(t, []fleet.ModelEntry{{ID: "big"}, {ID: "small"}, {ID: "lora", Parent: "small"}}, set.Models())
}

// TestPoolKeys: a pool is the replicas serving a model plus those sharing
// a served model with them (an adapter on some of a base model's replicas
// joins them into one pool); before any model is known, the fleet is one
// pool.
func TestPoolKeys(t *testing.T) {
	t.Parallel()
	a := &fleet.Replica{Name: "a", MaxSeqs: 8}
	b := &fleet.Replica{Name: "b", MaxSeqs: 8}
	c := &fleet.Replica{Name: "c", MaxSeqs: 8}
	d := &fleet.Replica{Name: "d", MaxSeqs: 4}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000, "c": 1000, "d": 500}), []*fleet.Replica{a, b, c, d}...)
	var all poolKey
	for i := range 4 {
		all.set(i)
	}
	assert.Equal(t, all, set.poolKeyOf("big"), "nothing known: one pool")

	a.Obs.Store(&fleet.Obs{OK: true, Models: []string{"big"}})
	b.Obs.Store(&fleet.Obs{OK: true, Models: []string{"big", "big-lora"}})
	c.Obs.Store(&fleet.Obs{OK: true, Models: []string{"small"}})
	d.Obs.Store(&fleet.Obs{OK: true, Models: []string{"small"}})
	var ab, cd poolKey
	ab.set(0)
	ab.set(1)
	cd.set(2)
	cd.set(3)
	assert.Equal(t, ab, set.poolKeyOf("big"))
	assert.Equal(t, ab, set.poolKeyOf("big-lora"), "the adapter on b shares b with big: one pool")
	assert.Equal(t, ab, set.poolKeyOf(""), "the default model is a's first")
	assert.Equal(t, cd, set.poolKeyOf("small"))
	assert.Equal(t, poolKey{}, set.poolKeyOf("nope"))

	require.NotNil(t, set.choose(fleet.Route{Model: "small"}, 100, nil))
	assert.Equal(t, gate.FleetLoad{Seqs: 1, SeqsCap: 12, Tokens: 100, TokensCap: 1500}, set.fleetOf(cd))
	assert.Equal(t, gate.FleetLoad{Seqs: 0, SeqsCap: 16, Tokens: 0, TokensCap: 2000}, set.fleetOf(ab))
	assert.True(t, set.roomOutside(cd, 1), "a and b are idle")
	for range 8 {
		require.NotNil(t, set.choose(fleet.Route{Model: "big"}, 10, nil))
	}
	for range 8 {
		require.NotNil(t, set.choose(fleet.Route{Model: "big"}, 10, nil))
	}
	assert.False(t, set.roomOutside(cd, 1), "a and b are full")
	assert.True(t, set.roomOutside(ab, 1))
}

// TestPoolMoveBalances: a call's pool load follows its spot, a repeated
// move is a no-op, and a tenant's entry goes once it holds nothing.
func TestPoolMoveBalances(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := t0
	p := poolTable{now: func() time.Time { return clk }}
	var k poolKey
	k.set(1)
	x := &policy.Tenant{Name: "x"}
	c1 := &call{t: x, pool: k, size: 100}
	c2 := &call{t: x, pool: k, size: 30}
	p.move(c1, spotQueued)
	p.move(c2, spotQueued)
	p.move(c1, spotHeld)
	p.move(c1, spotHeld)
	clk = t0.Add(time.Second)
	pl := p.pools[k]
	assert.Equal(t, poolTenant{held: 1, queued: 1, tokens: 100, arrived: 2}, *pl.tenants["x"])
	p.move(c1, spotQueued) // a slot denial puts it back: no new arrival
	p.move(c2, spotHeld)
	clk = t0.Add(3500 * time.Millisecond)
	assert.Equal(t, poolTenant{held: 1, queued: 1, tokens: 30, arrived: 2}, *pl.tenants["x"])
	assert.False(t, pl.idle())
	p.move(c1, spotNone)
	c2.sent = true // ran upstream: a service time
	p.move(c2, spotNone)
	p.move(c2, spotNone)
	assert.Equal(t, poolTenant{arrived: 2, served: 1, servedSec: 2.5}, *pl.tenants["x"])
	assert.True(t, pl.idle())
}

func TestPriceCached(t *testing.T) {
	t.Parallel()
	p := &policy.Snapshot{Prices: map[string]config.Price{
		"m":     {Model: "m", InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000, CachedInputPerMTok: 300_000},
		"plain": {Model: "plain", InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000},
	}}
	// 1000 input of which 800 cached, 100 output: 200·3 + 800·0.3 + 100·15 = 2340 µUSD.
	assert.Equal(t, int64(2340), p.PriceCached("m", 1000, 800, 100))
	assert.Equal(t, p.PriceMicros("m", 1000, 100), p.PriceCached("m", 1000, 0, 100))
	assert.Equal(t, int64(4500), p.PriceCached("plain", 1000, 800, 100), "no cached price: all input at the input rate")
	assert.Equal(t, int64(1500+300), p.PriceCached("m", 1000, 5000, 100), "cached never exceeds input")
}

// TestPoolKeysFollowModelLists: the memoised pools follow every change of a
// replica's model list, and a poll that keeps the list keeps the memo.
func TestPoolKeysFollowModelLists(t *testing.T) {
	t.Parallel()
	a := &fleet.Replica{Name: "a", MaxSeqs: 8}
	b := &fleet.Replica{Name: "b", MaxSeqs: 8}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000}), []*fleet.Replica{a, b}...)
	var ka, kb, both poolKey
	ka.set(0)
	kb.set(1)
	both.set(0)
	both.set(1)
	a.Obs.Store(&fleet.Obs{OK: true, Models: []string{"x"}})
	b.Obs.Store(&fleet.Obs{OK: true, Models: []string{"y"}})
	assert.Equal(t, ka, set.poolKeyOf("x"))
	assert.Equal(t, kb, set.poolKeyOf("y"))
	memo := set.pools.Load()

	// A poll that did not re-read /v1/models carries the list over.
	prev := a.Obs.Load()
	a.Obs.Store(&fleet.Obs{OK: true, Running: 3, Models: prev.Models})
	assert.Equal(t, ka, set.poolKeyOf("x"))
	assert.Same(t, memo, set.pools.Load(), "same lists: the memo stands")

	// b loads x as well: both pools merge.
	b.Obs.Store(&fleet.Obs{OK: true, Models: []string{"y", "x"}})
	assert.Equal(t, both, set.poolKeyOf("x"))
	assert.Equal(t, both, set.poolKeyOf("y"), "b shares x with a")
	// b drops y, then its list empties: unknown models go, a serves x alone.
	b.Obs.Store(&fleet.Obs{OK: true, Models: []string{"x"}})
	assert.Equal(t, poolKey{}, set.poolKeyOf("y"))
	b.Obs.Store(&fleet.Obs{OK: true})
	assert.Equal(t, ka, set.poolKeyOf("x"))
}

// BenchmarkPoolKeyOf: a request's pool on a fleet of 128 replicas, each
// serving one of 8 models (the memo's hit, and the computation it saves).
func BenchmarkPoolKeyOf(b *testing.B) {
	var reps []*fleet.Replica
	for i := range 128 {
		r := &fleet.Replica{Name: fmt.Sprint("r", i), MaxSeqs: 8}
		r.Obs.Store(&fleet.Obs{OK: true, Models: []string{fmt.Sprint("m", i%8)}})
		reps = append(reps, r)
	}
	set := newSet(nil, reps...)
	b.Run("memo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = set.poolKeyOf("m3")
		}
	})
	b.Run("compute", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = set.computePoolKey(set.List(), "m3")
		}
	})
}
