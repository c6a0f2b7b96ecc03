package fleet

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/gate"
)

// TestReplicaPools: a model is routed to the replicas serving it (the
// config list standing in until /v1/models answers), least load first.
func TestReplicaPools(t *testing.T) {
	t.Parallel()
	a := &Replica{Name: "a", MaxSeqs: 8}
	b := &Replica{Name: "b", MaxSeqs: 8}
	c := &Replica{Name: "c", MaxSeqs: 8, Pinned: []string{"small", "lora"}}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000, "c": 1000}), a, b, c)

	// c's config list stands in until /v1/models answers; a and b are
	// unknown and, being up, keep unknown models from being a 404.
	assert.Equal(t, []*Replica{c}, set.Pool("small"))
	assert.True(t, set.KnowsModel("big"), "a and b have not listed their models yet")

	a.Obs.Store(&Obs{OK: true, Models: []string{"big"}})
	b.Obs.Store(&Obs{OK: true, Models: []string{"big"}})
	c.Obs.Store(&Obs{OK: true, Models: []string{"small", "lora", "other"}, Parents: map[string]string{"lora": "small"}})
	assert.False(t, set.KnowsModel("other"), "config restricts c to small and lora")
	assert.False(t, set.KnowsModel("nope"))
	assert.Equal(t, "big", set.DefaultModel())
	assert.Equal(t, []*Replica{a, b}, set.Pool(""), "no model: vLLM's default, the first replica's first model")

	for range 10 {
		r := set.choose(Route{Model: "big"}, 10, nil)
		require.NotNil(t, r)
		assert.NotEqual(t, c, r)
	}
	assert.Equal(t, int64(100), a.Load.Load()+b.Load.Load())
	assert.Equal(t, int64(50), a.Load.Load(), "least load within the pool")
	assert.Equal(t, c, set.choose(Route{Model: "lora"}, 990, nil))
	assert.Nil(t, set.choose(Route{Model: "small"}, 20, nil), "c is full; a and b do not serve small")
	assert.Equal(t, int64(1000), set.MaxCapacity("small"))

	assert.Equal(t, []ModelEntry{{ID: "big"}, {ID: "small"}, {ID: "lora", Parent: "small"}}, set.Models())
}

// TestPoolKeys: a pool is the replicas serving a model plus those sharing
// a served model with them (an adapter on some of a base model's replicas
// joins them into one pool); before any model is known, the fleet is one
// pool.
func TestPoolKeys(t *testing.T) {
	t.Parallel()
	a := &Replica{Name: "a", MaxSeqs: 8}
	b := &Replica{Name: "b", MaxSeqs: 8}
	c := &Replica{Name: "c", MaxSeqs: 8}
	d := &Replica{Name: "d", MaxSeqs: 4}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000, "c": 1000, "d": 500}), a, b, c, d)
	var all PoolKey
	for i := range 4 {
		all.Set(i)
	}
	assert.Equal(t, all, set.PoolKeyOf("big"), "nothing known: one pool")

	a.Obs.Store(&Obs{OK: true, Models: []string{"big"}})
	b.Obs.Store(&Obs{OK: true, Models: []string{"big", "big-lora"}})
	c.Obs.Store(&Obs{OK: true, Models: []string{"small"}})
	d.Obs.Store(&Obs{OK: true, Models: []string{"small"}})
	var ab, cd PoolKey
	ab.Set(0)
	ab.Set(1)
	cd.Set(2)
	cd.Set(3)
	assert.Equal(t, ab, set.PoolKeyOf("big"))
	assert.Equal(t, ab, set.PoolKeyOf("big-lora"), "the adapter on b shares b with big: one pool")
	assert.Equal(t, ab, set.PoolKeyOf(""), "the default model is a's first")
	assert.Equal(t, cd, set.PoolKeyOf("small"))
	assert.Equal(t, PoolKey{}, set.PoolKeyOf("nope"))

	require.NotNil(t, set.choose(Route{Model: "small"}, 100, nil))
	assert.Equal(t, gate.FleetLoad{Seqs: 1, SeqsCap: 12, Tokens: 100, TokensCap: 1500}, set.FleetOf(cd, false, 0))
	assert.Equal(t, gate.FleetLoad{Seqs: 0, SeqsCap: 16, Tokens: 0, TokensCap: 2000}, set.FleetOf(ab, false, 0))
	f := set.FleetOf(cd, false, 300)
	assert.Equal(t, int64(1500), f.TokensCap)
	assert.Equal(t, int64(100+(900%300)+(500%300)), f.Tokens, "the slivers below a request of 300 on each replica are no room for it")
	assert.True(t, f.FitsBeyond(300, 0.6), "after this one, three more of 300 fit (900 tokens kept)")
	assert.False(t, f.FitsBeyond(300, 0.65), "975 tokens kept do not, though 1,400 are free: c's 900 and d's 500 hold three and one")
	assert.True(t, set.RoomOutside(cd, 1), "a and b are idle")
	for range 8 {
		require.NotNil(t, set.choose(Route{Model: "big"}, 10, nil))
	}
	for range 8 {
		require.NotNil(t, set.choose(Route{Model: "big"}, 10, nil))
	}
	assert.False(t, set.RoomOutside(cd, 1), "a and b are full")
	assert.True(t, set.RoomOutside(ab, 1))
}

// TestPoolKeysFollowModelLists: the memoised pools follow every change of a
// replica's model list, and a poll that keeps the list keeps the memo.
func TestPoolKeysFollowModelLists(t *testing.T) {
	t.Parallel()
	a := &Replica{Name: "a", MaxSeqs: 8}
	b := &Replica{Name: "b", MaxSeqs: 8}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000}), a, b)
	var ka, kb, both PoolKey
	ka.Set(0)
	kb.Set(1)
	both.Set(0)
	both.Set(1)
	a.Obs.Store(&Obs{OK: true, Models: []string{"x"}})
	b.Obs.Store(&Obs{OK: true, Models: []string{"y"}})
	assert.Equal(t, ka, set.PoolKeyOf("x"))
	assert.Equal(t, kb, set.PoolKeyOf("y"))
	memo := set.pools.Load()

	// A poll that did not re-read /v1/models carries the list over.
	prev := a.Obs.Load()
	a.Obs.Store(&Obs{OK: true, Running: 3, Models: prev.Models})
	assert.Equal(t, ka, set.PoolKeyOf("x"))
	assert.Same(t, memo, set.pools.Load(), "same lists: the memo stands")

	// b loads x as well: both pools merge.
	b.Obs.Store(&Obs{OK: true, Models: []string{"y", "x"}})
	assert.Equal(t, both, set.PoolKeyOf("x"))
	assert.Equal(t, both, set.PoolKeyOf("y"), "b shares x with a")
	// b drops y, then its list empties: unknown models go, a serves x alone.
	b.Obs.Store(&Obs{OK: true, Models: []string{"x"}})
	assert.Equal(t, PoolKey{}, set.PoolKeyOf("y"))
	b.Obs.Store(&Obs{OK: true})
	assert.Equal(t, ka, set.PoolKeyOf("x"))
}

// BenchmarkPoolKeyOf: a request's pool on a fleet of 128 replicas, each
// serving one of 8 models (the memo's hit, and the computation it saves).
func BenchmarkPoolKeyOf(b *testing.B) {
	var reps []*Replica
	for i := range 128 {
		r := &Replica{Name: fmt.Sprint("r", i), MaxSeqs: 8}
		r.Obs.Store(&Obs{OK: true, Models: []string{fmt.Sprint("m", i%8)}})
		reps = append(reps, r)
	}
	set := newSet(nil, reps...)
	b.Run("memo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = set.PoolKeyOf("m3")
		}
	})
	b.Run("compute", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = set.computePoolKey(set.List(), "m3")
		}
	})
}
