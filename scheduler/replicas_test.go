package scheduler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
)

func TestReplicaPools(t *testing.T) {
	t.Parallel()
	a := &replica{name: "a", maxSeqs: 8}
	b := &replica{name: "b", maxSeqs: 8}
	c := &replica{name: "c", maxSeqs: 8, pinned: []string{"small", "lora"}}
	set := &replicaSet{reps: []*replica{a, b, c}, capacity: fixedCapacity(map[string]int64{"a": 1000, "b": 1000, "c": 1000})}

	// c's config list stands in until /v1/models answers; a and b are
	// unknown and, being up, keep unknown models from being a 404.
	assert.Equal(t, []*replica{c}, set.pool("small"))
	assert.True(t, set.knowsModel("big"), "a and b have not listed their models yet")

	a.obs.Store(&replicaObs{ok: true, models: []string{"big"}})
	b.obs.Store(&replicaObs{ok: true, models: []string{"big"}})
	c.obs.Store(&replicaObs{ok: true, models: []string{"small", "lora", "other"}, parents: map[string]string{"lora": "small"}})
	assert.False(t, set.knowsModel("other"), "config restricts c to small and lora")
	assert.False(t, set.knowsModel("nope"))
	assert.Equal(t, "big", set.defaultModel())
	assert.Equal(t, []*replica{a, b}, set.pool(""), "no model: vLLM's default, the first replica's first model")

	for range 10 {
		r := set.choose(route{model: "big"}, 10, true, nil)
		require.NotNil(t, r)
		assert.NotEqual(t, c, r)
	}
	assert.Equal(t, int64(100), a.load.Load()+b.load.Load())
	assert.Equal(t, int64(50), a.load.Load(), "least load within the pool")
	assert.Equal(t, c, set.choose(route{model: "lora"}, 990, true, nil))
	assert.Nil(t, set.choose(route{model: "small"}, 20, true, nil), "c is full; a and b do not serve small")
	assert.Equal(t, int64(1000), set.maxCapacity("small"))

	assert.Equal(t, []modelEntry{{id: "big"}, {id: "small"}, {id: "lora", parent: "small"}}, set.models())
}

func TestFairSharePerPool(t *testing.T) {
	t.Parallel()
	a := &replica{name: "a", pinned: []string{"big"}}
	c := &replica{name: "c", pinned: []string{"small", "lora"}}
	set := &replicaSet{reps: []*replica{a, c}, capacity: fixedCapacity(map[string]int64{"a": 1000, "c": 1000})}
	w := func(string) int64 { return 1 }

	// x fills the big pool; y waits on the small one: x is alone on its
	// pool, so it stays below its share there.
	set.track("big", "x", 900, 0)
	set.track("small", "y", 0, 1)
	assert.True(t, set.belowShare("big", "x", w))
	// y's adapter traffic shares c with small: one pool.
	set.track("lora", "x", 100, 0)
	assert.False(t, set.belowShare("small", "x", w), "x holds all of c's load while y waits for it")
	assert.True(t, set.belowShare("small", "y", w))
	set.track("lora", "x", -100, 0)
	set.track("small", "y", 0, -1)
	set.track("big", "x", -900, 0)
	assert.Empty(t, set.loads, "entries go once they are zero")
}

func TestPriceCached(t *testing.T) {
	t.Parallel()
	p := &policy{prices: map[string]config.Price{
		"m":     {Model: "m", InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000, CachedInputPerMTok: 300_000},
		"plain": {Model: "plain", InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000},
	}}
	// 1000 input of which 800 cached, 100 output: 200·3 + 800·0.3 + 100·15 = 2340 µUSD.
	assert.Equal(t, int64(2340), p.priceCached("m", 1000, 800, 100))
	assert.Equal(t, p.priceMicros("m", 1000, 100), p.priceCached("m", 1000, 0, 100))
	assert.Equal(t, int64(4500), p.priceCached("plain", 1000, 800, 100), "no cached price: all input at the input rate")
	assert.Equal(t, int64(1500+300), p.priceCached("m", 1000, 5000, 100), "cached never exceeds input")
}

// BenchmarkBelowShare is the per-pool fair-share check of the dispatch
// predicate: 8 tenants with work on 3 models of 2 pools.
func BenchmarkBelowShare(b *testing.B) {
	a := &replica{name: "a", pinned: []string{"big"}}
	c := &replica{name: "c", pinned: []string{"small", "lora"}}
	set := &replicaSet{reps: []*replica{a, c}, capacity: fixedCapacity(map[string]int64{"a": 1000, "c": 1000})}
	for i := range 8 {
		for _, m := range []string{"big", "small", "lora"} {
			set.track(m, string(rune('p'+i)), int64(100*(i+1)), 1)
		}
	}
	w := func(string) int64 { return 1 }
	b.ReportAllocs()
	for b.Loop() {
		set.belowShare("small", "q", w)
	}
}
