package fleet

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/peers"
)

// TestSeqShare: the split by instance where reports carry no tenants (an
// older version's), and by the tenants' weights where they do.
func TestSeqShare(t *testing.T) {
	e := func(id string, in, q int64) peers.Entry { return peers.Entry{Instance: id, InFlight: in, Queued: q} }
	td := func(name string, w int64, demand float64) peers.TenantDemand {
		return peers.TenantDemand{Tenant: name, Weight: w, Load: int64(demand * 1000), Claim: int64(demand * 1000)}
	}
	// busy is a backlogged tenant: it claims the batch, and its averaged
	// demand is past it (its queue).
	busy := func(name string, w int64, maxSeqs float64) peers.TenantDemand {
		return peers.TenantDemand{Tenant: name, Weight: w, Load: int64(2 * maxSeqs * 1000), Claim: int64(maxSeqs * 1000)}
	}
	te := func(id string, ts ...peers.TenantDemand) peers.Entry { return peers.Entry{Instance: id, Tenants: ts} }
	// waiting is td with one request of it queued.
	waiting := func(name string, w int64, demand float64) peers.TenantDemand {
		d := td(name, w, demand)
		d.Queued = 1000
		return d
	}
	cases := []struct {
		name   string
		max    int64
		mine   peers.Entry
		others []peers.Entry
		want   int64
	}{
		{"two backlogged split evenly", 4, e("a", 4, 9), []peers.Entry{e("b", 4, 9)}, 2},
		{"odd: the remainder to the first id", 5, e("a", 5, 9), []peers.Entry{e("b", 5, 9)}, 3},
		{"odd: the second id gets the floor", 5, e("b", 5, 9), []peers.Entry{e("a", 5, 9)}, 2},
		{"an other needing less (light) keeps its claim and a margin (2 + 2·√2), the rest is ours", 8, e("a", 8, 8), []peers.Entry{e("b", 1, 1)}, 3},
		{"no instance heavy: no cap", 4, e("a", 2, 0), []peers.Entry{e("b", 0, 0)}, 0},
		{"water-filling over three: a (light) keeps 1 + 2·√1, b and c split 7, the remainder to the first id", 10, e("c", 20, 0), []peers.Entry{e("a", 1, 0), e("b", 20, 0)}, 3},
		{"water-filling over three, seen by b", 10, e("b", 20, 0), []peers.Entry{e("a", 1, 0), e("c", 20, 0)}, 4},
		{"more instances than sequences: at least one", 2, e("z", 9, 9), []peers.Entry{e("a", 9, 9), e("b", 9, 9), e("c", 9, 9)}, 1},
		{"a report past any sum counts as max_num_seqs", 4, e("a", 1<<62, 1<<62), []peers.Entry{e("b", 1<<62, 1<<62)}, 2},
		{"nothing asked here: the floor", 8, e("a", 0, 0), []peers.Entry{e("b", 8, 8)}, 1},

		// The isolation row across instances: three light tenants asking
		// 3.2 each of 16 at b, a flood at a. Split by instance each would
		// get 8. Split as the gate splits a pool, the light tenants are
		// given what they ask and two Poisson deviations of it (2·√9.6):
		// 15.8.
		{"light tenants at one instance are given their claims and a margin", 16,
			te("b", td("v1", 1, 3.2), td("v2", 1, 3.2), td("v3", 1, 3.2)), []peers.Entry{te("a", busy("flood", 1, 16))}, 15},
		{"and the flood's instance the rest", 16,
			te("a", busy("flood", 1, 16)), []peers.Entry{te("b", td("v1", 1, 3.2), td("v2", 1, 3.2), td("v3", 1, 3.2))}, 1},
		{"light claims that do not fit leave the heavy tenants one sequence", 8,
			te("b", td("v1", 1, 2.5), td("v2", 1, 2.5), td("v3", 1, 2.5)), []peers.Entry{te("a", busy("flood", 1, 8))}, 7},
		{"a light tenant waiting on a batch of two or more: the heavy tenants keep their floor", 8,
			te("b", waiting("v1", 1, 2.5), td("v2", 1, 2.5), td("v3", 1, 2.5)), []peers.Entry{te("a", busy("flood", 1, 8))}, 7},
		{"and the flood's instance its one", 8,
			te("a", busy("flood", 1, 8)), []peers.Entry{te("b", waiting("v1", 1, 2.5), td("v2", 1, 2.5), td("v3", 1, 2.5))}, 1},
		{"floods at two instances share the floor of a batch of two; a light tenant waiting: the one rounded down starts none", 2,
			te("z", busy("f2", 1, 2)), []peers.Entry{te("a", busy("f1", 1, 2)), te("b", waiting("v", 1, 2))}, NoSeqs},
		{"and the other its one", 2,
			te("a", busy("f1", 1, 2)), []peers.Entry{te("z", busy("f2", 1, 2)), te("b", waiting("v", 1, 2))}, 1},
		{"a flood waiting is no light tenant waiting", 8,
			te("a", waiting("flood", 1, 8)), []peers.Entry{te("b", td("v1", 1, 2.5), td("v2", 1, 2.5), td("v3", 1, 2.5))}, 1},
		{"a batch of one (a KV cache that holds one request), the light tenant idle: the flood's floor", 1,
			te("a", busy("flood", 1, 1)), []peers.Entry{te("b", td("v", 3, 1))}, 1},
		{"a batch of one, the light tenant waiting: none", 1,
			te("a", busy("flood", 1, 1)), []peers.Entry{te("b", waiting("v", 3, 1))}, NoSeqs},
		{"a light tenant waiting where the batch has room for the heavy tenants too: their part (16 − 2 − 2·√2)", 16,
			te("a", busy("flood", 1, 16)), []peers.Entry{te("b", waiting("v", 1, 2))}, 11},
		{"a light tenant above its share (6), within gate.LightMargin of it, is given its claim and a margin", 12,
			te("b", td("v", 1, 8)), []peers.Entry{te("a", busy("flood", 1, 12))}, 11},
		{"weights: 4 to 1", 10, te("a", busy("big", 4, 10)), []peers.Entry{te("b", busy("small", 1, 10))}, 8},
		{"a tenant at two instances is one claimant, split by its claims there", 8,
			te("a", busy("acme", 1, 8), busy("beta", 1, 8)), []peers.Entry{te("b", busy("acme", 1, 8))}, 6},
		{"the same, seen by b", 8, te("b", busy("acme", 1, 8)), []peers.Entry{te("a", busy("acme", 1, 8), busy("beta", 1, 8))}, 2},
		{"weights that disagree (a reload on its way): the larger", 10,
			te("a", busy("big", 1, 10)), []peers.Entry{te("b", busy("big", 4, 10), busy("small", 1, 10))}, 4},
		{"an older version's report is one claimant of weight 1", 8, te("a", busy("x", 3, 8)), []peers.Entry{e("b", 8, 0)}, 6},
		{"light tenants only: no cap, as the gate holds no light tenant back", 16, te("a", td("x", 1, 2)), []peers.Entry{te("b", td("y", 1, 3))}, 0},
		{"a light tenant beside a heavy one elsewhere: its claim and a margin (2 + 2·√2)", 16, te("a", td("x", 1, 2)), []peers.Entry{te("b", busy("y", 1, 16))}, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, SeqShare(c.max, c.mine, c.others))
		})
	}
}

// TestSeqShareAgainstProgressiveFilling: over seeded fleets (2–5 instances,
// 1–6 tenants of weight 1–4 reaching random instances with random loads
// and claims, batches of 1–64), each instance's share is its part of the
// split as SeqShare's doc states it, with every max-min step computed
// independently by progressive filling (every unsatisfied claimant raised
// in small steps in proportion to its weight until the budget is spent),
// within one for rounding (where no tenant is heavy, only at an instance
// with a light tenant given less than its claim while a light tenant at
// another instance has requests queued; elsewhere no cap); and where the
// batch is all given and no instance is at the floor, the shares the
// instances compute from the same reports sum to the batch.
func TestSeqShareAgainstProgressiveFilling(t *testing.T) {
	boundOnly := 0 // instances capped only by a cut light tenant
	for seed := range uint64(400) {
		rng := rand.New(rand.NewPCG(seed, 7))
		maxSeqs := 1 + rng.Int64N(64)
		nInst, nTen := 2+rng.IntN(4), 1+rng.IntN(6)
		weights := make([]int64, nTen)
		for i := range weights {
			weights[i] = 1 + rng.Int64N(4)
		}
		entries := make([]peers.Entry, nInst)
		for i := range entries {
			entries[i].Instance = fmt.Sprintf("i%d", i)
			for j := range nTen {
				if rng.IntN(2) == 0 {
					continue
				}
				load := rng.Int64N(maxSeqs*1000 + 1)
				if rng.IntN(3) == 0 {
					load = maxSeqs * 1000 * (1 + rng.Int64N(3)) // backlogged
				}
				claim := load + rng.Int64N(maxSeqs*500+1) // and a peak
				var queued int64
				if rng.IntN(4) == 0 {
					queued = rng.Int64N(claim + 1)
				}
				entries[i].Tenants = append(entries[i].Tenants,
					peers.TenantDemand{Tenant: fmt.Sprintf("t%d", j), Weight: weights[j], Load: load, Claim: claim, Queued: queued})
			}
			if len(entries[i].Tenants) == 0 {
				entries[i].Tenants = []peers.TenantDemand{{Tenant: "t0", Weight: weights[0], Load: 1, Claim: 1}}
			}
		}
		part, given, heavy, waiting, bound := splitByFilling(maxSeqs, entries)
		var sum int64
		floored := false
		for i, mine := range entries {
			others := slices.Concat(entries[:i], entries[i+1:])
			got := SeqShare(maxSeqs, mine, others)
			if !heavy && !bound[mine.Instance] {
				require.Zerof(t, got, "seed %d: no tenant heavy, no cap", seed)
				continue
			}
			if !heavy {
				boundOnly++
			}
			want := part[mine.Instance] + float64(maxSeqs) - given // ours: all not given
			if got == NoSeqs {
				require.Truef(t, waiting, "seed %d instance %s: none only while a light tenant waits", seed, mine.Instance)
				got = 0
			}
			floored = floored || (want < 1 && !waiting)
			require.InDeltaf(t, want, float64(got), 1+1e-6, "seed %d instance %s: share %d, part %.3f (max %d)", seed, mine.Instance, got, want, maxSeqs)
			sum += got
		}
		if heavy && given >= float64(maxSeqs)-1e-6 && !floored {
			require.Equalf(t, maxSeqs, sum, "seed %d: the shares sum to the batch", seed)
		}
	}
	assert.Positive(t, boundOnly, "the draws reach a cap without a heavy tenant")
	t.Logf("%d instances capped without a heavy tenant", boundOnly)
}

// fill is progressive filling: each claimant with an ask above its
// allocation is raised by step·weight until budget is spent; it returns
// the allocations and the level reached per unit of weight (+Inf when
// every ask is met).
func fill(budget float64, names []string, ask, weight map[string]float64) (map[string]float64, float64) {
	alloc := map[string]float64{}
	spent, level := 0.0, 0.0
	const step = 1.0 / 2000
	for {
		active := 0.0
		for _, n := range names {
			if alloc[n] < ask[n]-1e-12 {
				active += weight[n]
			}
		}
		if active == 0 {
			return alloc, math.Inf(1)
		}
		if spent >= budget-1e-9 {
			return alloc, level
		}
		st := min(step, (budget-spent)/active)
		level += st
		for _, n := range names {
			if alloc[n] < ask[n]-1e-12 {
				add := min(st*weight[n], ask[n]-alloc[n])
				alloc[n] += add
				spent += add
			}
		}
	}
}

// splitByFilling is SeqShare's split as its doc states it, in requests:
// each instance's part, how much of the batch was given, whether any
// tenant is heavy (else nothing is capped), and whether then a light one
// has requests queued (no floor then).
func splitByFilling(maxSeqs int64, entries []peers.Entry) (part map[string]float64, given float64, heavy, waiting bool, bound map[string]bool) {
	limit := float64(maxSeqs)
	load, claim, weight, queued := map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}
	var names []string
	for _, e := range entries {
		for _, td := range e.Tenants {
			if _, ok := claim[td.Tenant]; !ok {
				names = append(names, td.Tenant)
			}
			load[td.Tenant] += float64(td.Load) / 1000
			claim[td.Tenant] += min(float64(td.Claim)/1000, limit)
			weight[td.Tenant] = max(weight[td.Tenant], float64(td.Weight))
			queued[td.Tenant] += float64(td.Queued) / 1000
		}
	}
	for _, n := range names {
		claim[n] = min(claim[n], limit)
		load[n] = min(load[n], 2*limit)
	}
	_, level := fill(limit, names, load, weight)
	var light, heavies []string
	lightSum, heavySum := 0.0, 0.0
	for _, n := range names {
		if load[n] <= gate.LightMargin*weight[n]*level+1e-9 && load[n] <= limit {
			light, lightSum = append(light, n), lightSum+claim[n]
			waiting = waiting || queued[n] > 0
		} else {
			heavies, heavySum = append(heavies, n), heavySum+claim[n]
		}
	}
	heavy = len(heavies) > 0
	want := maps.Clone(claim)
	budget := limit
	if heavy && lightSum > 0 {
		extra := 0.0
		for _, n := range light {
			want[n] = claim[n] * (1 + gate.BurstK*math.Sqrt(lightSum)/lightSum)
			extra += want[n] // nothing reported held
		}
		if least := DefaultReserve.Headroom * limit; extra < least {
			for _, n := range light {
				want[n] += (least - extra) * claim[n] / lightSum
			}
		}
		if limit >= 2 {
			budget -= min(1, heavySum)
		}
	}
	lightAlloc, _ := fill(budget, light, want, weight)
	left := limit
	for _, n := range light {
		left -= lightAlloc[n]
	}
	heavyAlloc, _ := fill(left, heavies, want, weight)
	// An instance is bound where a light tenant of its is given less than
	// its claim while a light tenant at another instance has requests
	// queued (ShareOf.Cut).
	bound = map[string]bool{}
	for _, e := range entries {
		for _, td := range e.Tenants {
			n := td.Tenant
			if !slices.Contains(light, n) || lightAlloc[n] >= claim[n]-1e-6 {
				continue
			}
			for _, o := range entries {
				bound[e.Instance] = bound[e.Instance] || o.Instance != e.Instance && slices.ContainsFunc(o.Tenants, func(x peers.TenantDemand) bool {
					return x.Queued > 0 && slices.Contains(light, x.Tenant)
				})
			}
		}
	}
	part = map[string]float64{}
	for _, n := range names {
		a := lightAlloc[n] + heavyAlloc[n]
		given += a
		for _, e := range entries {
			for _, td := range e.Tenants {
				if td.Tenant == n {
					part[e.Instance] += a * min(float64(td.Claim)/1000, limit) / claim0(entries, n, limit)
				}
			}
		}
	}
	return part, given, heavy, waiting && heavy, bound
}

// claim0 is tenant n's claims summed before the cap at the batch: its
// parts are in proportion to them.
func claim0(entries []peers.Entry, n string, limit float64) float64 {
	s := 0.0
	for _, e := range entries {
		for _, td := range e.Tenants {
			if td.Tenant == n {
				s += min(float64(td.Claim)/1000, limit)
			}
		}
	}
	return s
}

// TestShareBatch: where the KV cache binds before max_num_seqs, the split
// divides what the cache holds (running ÷ KV usage at the last scrape),
// not max_num_seqs.
func TestShareBatch(t *testing.T) {
	r := &Replica{Name: "r", MaxSeqs: 256}
	assert.Equal(t, int64(256), r.ShareBatch(), "no scrape")
	r.Obs.Store(&Obs{OK: true, Running: 12, KVUsage: 0.98})
	assert.Equal(t, int64(12), r.ShareBatch(), "a full cache of 12")
	r.Obs.Store(&Obs{OK: true, Running: 5, KVUsage: 0.1})
	assert.Equal(t, int64(50), r.ShareBatch())
	r.Obs.Store(&Obs{OK: true, Running: 0, KVUsage: 0})
	assert.Equal(t, int64(256), r.ShareBatch(), "nothing running: nothing to read")
}

// TestLightTenantsNotCapped: on a replica another instance floods, this
// instance's share leaves the flood one sequence; the tenant the split
// holds light may use any room, as on one instance, while a tenant it
// does not report (or a heavy one) is held to the share.
func TestLightTenantsNotCapped(t *testing.T) {
	set, r := sizingSet(8)
	now := time.Unix(1_800_000_000, 0)
	mine := []peers.Report{{Replica: "r", InFlight: 2, Tenants: []peers.TenantDemand{{Tenant: "light", Weight: 1, Load: 1000, Claim: 2000}}}}
	flood := peers.Entry{Instance: "b", InFlight: 6, Queued: 40,
		Tenants: []peers.TenantDemand{{Tenant: "flood", Weight: 1, Load: 46000, Claim: 8000}}}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, map[string][]peers.Entry{"r": {flood}})
	require.Equal(t, int64(5), r.Share.Load(), "2 + 2·√2 = 4.8 of 8")
	r.Count.Store(5)       // at its share
	scrapeRW(r, 6, 0, now) // and one of the other's running
	rep, _ := set.Take(Route{Tenant: "light"}, 1, nil)
	assert.Same(t, r, rep, "light: any room")
	assert.True(t, set.Fits(Route{Tenant: "other", NoShare: true}, 1), "the share binds, not the replica")
	rep, _ = set.Take(Route{Tenant: "other"}, 1, nil)
	assert.Nil(t, rep, "not held light: the share binds")
	var key PoolKey
	key.Set(r.Slot)
	assert.False(t, set.HeldHeavy(key, "light"))
	assert.False(t, set.HeldHeavy(key, "other"), "not classified: the gate decides")

	mine[0].Tenants[0].Load = 40000
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, map[string][]peers.Entry{"r": {flood}})
	require.Positive(t, r.Share.Load())
	assert.True(t, set.HeldHeavy(key, "light"), "asking five times the batch: held heavy")
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, nil, nil)
	assert.False(t, set.HeldHeavy(key, "light"), "no share: nothing binds it")
}

// TestCutLightTenantBound: where the light tenants' claims do not fit
// the batch, the split gives them max-min parts by weight; a light tenant
// given less than its claim is bound by this instance's share while a
// light tenant at another instance has requests queued (ShareOf.Cut),
// and free again once none waits there, unless its gate here lets it
// through as no flood with a standing queue (Stands). On a batch of 6
// with a flood (the heavy tenants' one sequence), a light tenant of
// weight 3 claiming the whole batch here and one of weight 2 claiming it
// at b split the other 5 3 : 2: this instance's cap is the loop's 3 and
// the flood's 1.
func TestCutLightTenantBound(t *testing.T) {
	set, r := sizingSet(6)
	now := time.Unix(1_800_000_000, 0)
	mine := []peers.Report{{Replica: "r", InFlight: 4, Tenants: []peers.TenantDemand{
		{Tenant: "loop", Weight: 3, Load: 5500, Claim: 6000, Queued: 2000},
		{Tenant: "flood", Weight: 3, Load: 8800, Claim: 6000, Queued: 6000}}}}
	at := func(queued int64) map[string][]peers.Entry {
		return map[string][]peers.Entry{"r": {{Instance: "b", Queued: queued / 1000,
			Tenants: []peers.TenantDemand{{Tenant: "v", Weight: 2, Load: 1300, Claim: 6000, Queued: queued}}}}}
	}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, at(6000))
	require.Equal(t, int64(4), r.Share.Load())
	sh := r.split.Load()
	assert.Equal(t, []string{"loop"}, sh.Cut)
	assert.ElementsMatch(t, []string{"loop", "flood"}, sh.Heavy)
	assert.Empty(t, sh.Light)
	bound, cut := r.Bound()
	assert.ElementsMatch(t, []string{"loop", "flood"}, bound, "as the admin API shows them")
	assert.Equal(t, []string{"loop"}, cut)
	r.Count.Store(4)       // at its share
	scrapeRW(r, 4, 0, now) // the replica has room
	rep, _ := set.Take(Route{Tenant: "loop", Light: true}, 1, nil)
	assert.Nil(t, rep, "cut while v waits: the share binds")
	var key PoolKey
	key.Set(r.Slot)
	assert.True(t, set.HeldHeavy(key, "loop"))

	// The other side of the same reports: v is cut too, and the loop has
	// requests queued here.
	other := SplitPool(6, 1, DefaultReserve, at(6000)["r"][0], []peers.Entry{{Instance: "a", InFlight: 4, Tenants: mine[0].Tenants}})
	assert.Equal(t, ShareOf{Cap: 2, Heavy: []string{"v"}, Cut: []string{"v"}}, other)

	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, at(0))
	sh = r.split.Load()
	assert.Equal(t, []string{"loop"}, sh.Light, "nobody waits at b: light, free")
	assert.Empty(t, sh.Cut)
	rep, _ = set.Take(Route{Tenant: "loop", Light: true}, 1, nil)
	assert.Same(t, r, rep, "any room")
	r.Count.Store(4)

	// No tenant heavy (the flood gone): the light claims alone split the
	// batch 6 by weight, 3.6 : 2.4, and the cut loop is bound by a cap all
	// the same, where no heavy tenant would leave it none.
	loopOnly := []peers.Report{{Replica: "r", InFlight: 4, Tenants: mine[0].Tenants[:1]}}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, loopOnly, at(6000))
	assert.Equal(t, int64(4), r.Share.Load(), "3.6 of 6, and the larger fraction")
	assert.Equal(t, []string{"loop"}, r.split.Load().Cut)
	rep, _ = set.Take(Route{Tenant: "loop", Light: true}, 1, nil)
	assert.Nil(t, rep, "at its cap")
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, loopOnly, at(0))
	assert.Zero(t, r.Share.Load(), "nobody heavy, nobody waiting at b: no cap")

	// Its gate here lets the loop through as no flood with a standing
	// queue: bound at its part though nobody waits at b, as on one
	// instance its weighted share bounds it.
	standing := slices.Clone(loopOnly[0].Tenants)
	standing[0].Stands = true
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, []peers.Report{{Replica: "r", InFlight: 4, Tenants: standing}}, at(0))
	assert.Equal(t, int64(4), r.Share.Load(), "3.6 of 6, and the larger fraction")
	assert.Equal(t, []string{"loop"}, r.split.Load().Cut)
	rep, _ = set.Take(Route{Tenant: "loop", Light: true}, 1, nil)
	assert.Nil(t, rep, "at its cap")
	// Standing, but its part here below one request (weight 1 to v's 20:
	// 6/21 of a request): bound, it would start nothing.
	standing[0].Weight = 1
	other20 := map[string][]peers.Entry{"r": {{Instance: "b", Tenants: []peers.TenantDemand{{Tenant: "v", Weight: 20, Load: 1300, Claim: 6000}}}}}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, []peers.Report{{Replica: "r", InFlight: 4, Tenants: standing}}, other20)
	assert.Empty(t, r.split.Load().Cut, "a part below one request")
	assert.Zero(t, r.Share.Load(), "nobody heavy, nobody bound: no cap")
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, nil, nil)
	bound, cut = r.Bound()
	assert.Nil(t, bound, "no split")
	assert.Nil(t, cut)
}

// TestShareTieByInFlight: equal fractions of a batch go first to the
// instance with fewer requests in flight there, whatever the ids: two
// tenants cut to half of a batch of one take the sequence in turn, not
// the lower id every time.
func TestShareTieByInFlight(t *testing.T) {
	flood := peers.TenantDemand{Tenant: "flood", Weight: 1, Load: 9000, Claim: 1000}
	entry := func(id string, inFlight int64, tenant string) peers.Entry {
		return peers.Entry{Instance: id, InFlight: inFlight, Tenants: []peers.TenantDemand{
			{Tenant: tenant, Weight: 1, Load: 300, Claim: 1000, Queued: 1000}, flood}}
	}
	for _, c := range []struct {
		aIn, bIn int64
		a, b     int64
	}{{1, 0, NoSeqs, 1}, {0, 1, 1, NoSeqs}} {
		a, b := entry("a", c.aIn, "x"), entry("b", c.bIn, "y")
		assert.Equal(t, c.a, SplitPool(1, 1, DefaultReserve, a, []peers.Entry{b}).Cap, "a, in flight %d against %d", c.aIn, c.bIn)
		assert.Equal(t, c.b, SplitPool(1, 1, DefaultReserve, b, []peers.Entry{a}).Cap, "b, in flight %d against %d", c.bIn, c.aIn)
	}
}

// TestShareOfNone: on a batch of one (a KV cache that holds one request,
// where the heavy tenants keep no sequence), while a light tenant at
// another instance waits, this instance, whose tenants the split gives
// nothing, may start none of its heavy tenants' requests there (NoSeqs),
// though the replica has room; what it has in flight counts as past its
// share (Excess), and its light tenants still use any room. Once the
// light tenant stops waiting, the floor of one is back and the dispatch
// loop is woken.
func TestShareOfNone(t *testing.T) {
	set, r := sizingSet(1)
	now := time.Unix(1_800_000_000, 0)
	mine := []peers.Report{{Replica: "r", Tenants: []peers.TenantDemand{
		{Tenant: "flood", Weight: 1, Load: 5000, Claim: 1000}, {Tenant: "mine", Weight: 1, Load: 100, Claim: 100}}}}
	light := func(queued int64) map[string][]peers.Entry {
		return map[string][]peers.Entry{"r": {{Instance: "b", Queued: 1,
			Tenants: []peers.TenantDemand{{Tenant: "v", Weight: 3, Load: 500, Claim: 1000, Queued: queued}}}}}
	}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, light(1000))
	require.Equal(t, int64(NoSeqs), r.Share.Load())
	scrapeRW(r, 0, 0, now) // the replica idle
	rep, _ := set.Take(Route{Tenant: "flood"}, 1, nil)
	assert.Nil(t, rep, "a cap of none, though the replica has room")
	rep, _ = set.Take(Route{Tenant: "mine"}, 1, nil)
	assert.Same(t, r, rep, "held light by the split: any room")
	assert.Equal(t, int64(1), r.Excess(), "its one request is past a share of none")
	r.Count.Store(0)

	assert.True(t, ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, light(0)), "the share grew: wake")
	assert.Equal(t, int64(1), r.Share.Load(), "nobody waits: at least one")
	assert.False(t, ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, light(1000)), "shrank: nothing to let through")
	assert.True(t, ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, nil, nil), "gone: wake")
	assert.Zero(t, r.Share.Load())
}

// TestUnreportedTenantsByTheGate: a tenant this instance has not reported
// yet (its first requests here, before the next exchange) is bound by the
// share only where the dispatch gate holds it heavy; one the split holds
// heavy is bound whatever the gate says. The split's classes and the
// weight of the tenants only the others report are kept per replica.
func TestUnreportedTenantsByTheGate(t *testing.T) {
	set, r := sizingSet(8)
	now := time.Unix(1_800_000_000, 0)
	mine := []peers.Report{{Replica: "r", InFlight: 3, Tenants: []peers.TenantDemand{{Tenant: "heavy", Weight: 2, Load: 30000, Claim: 8000}}}}
	flood := peers.Entry{Instance: "b", InFlight: 5, Queued: 40,
		Tenants: []peers.TenantDemand{{Tenant: "flood", Weight: 3, Load: 46000, Claim: 8000}, {Tenant: "heavy", Weight: 2, Load: 1000, Claim: 1000}}}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, map[string][]peers.Entry{"r": {flood}})
	require.Positive(t, r.Share.Load())
	assert.Equal(t, int64(3), r.PeerWeight.Load(), "the flood's weight: the heavy tenant is reported here too")
	r.Count.Store(r.Share.Load()) // at its share
	scrapeRW(r, 6, 0, now)        // two slots free
	rep, _ := set.Take(Route{Tenant: "new", Light: true}, 1, nil)
	assert.Same(t, r, rep, "unreported, light by the gate: any room")
	rep, _ = set.Take(Route{Tenant: "new"}, 1, nil)
	assert.Nil(t, rep, "unreported, heavy by the gate: the share binds")
	rep, _ = set.Take(Route{Tenant: "heavy", Light: true}, 1, nil)
	assert.Nil(t, rep, "held heavy by the split: the share binds")

	var key PoolKey
	key.Set(r.Slot)
	assert.InDelta(t, 3.0, set.FleetOf(key, false, 0).PeerWeight, 1e-9, "the gate's view of the pool")
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, nil, nil)
	assert.Zero(t, r.PeerWeight.Load(), "no others: no weight beyond this instance's")
	assert.Zero(t, set.FleetOf(key, false, 0).PeerWeight)
}

// TestPeerWeight: the tenants only the others report, each once, an older
// instance's report without tenants as one of weight 1.
func TestPeerWeight(t *testing.T) {
	mine := peers.Entry{Instance: "a", Tenants: []peers.TenantDemand{{Tenant: "x", Weight: 4}}}
	others := []peers.Entry{
		{Instance: "b", Tenants: []peers.TenantDemand{{Tenant: "x", Weight: 4}, {Tenant: "y", Weight: 2}}},
		{Instance: "c", Tenants: []peers.TenantDemand{{Tenant: "y", Weight: 2}, {Tenant: "z", Weight: 0}}},
		{Instance: "old", InFlight: 3},
		{Instance: "idle"},
	}
	assert.Equal(t, int64(2+1+1), PeerWeight(mine, others))
}

// TestFloorOnce: an instance its split gives nothing keeps one request's
// floor on one replica of a pool, and none where another replica of the
// pool gives it room.
func TestFloorOnce(t *testing.T) {
	floor := func() *ShareOf { return &ShareOf{Cap: 1, Floor: true} }
	caps := func(shares []*ShareOf) []int64 {
		var out []int64
		for _, sh := range shares {
			if sh == nil {
				out = append(out, 0)
				continue
			}
			out = append(out, sh.Cap)
		}
		return out
	}
	cases := []struct {
		name   string
		shares []*ShareOf
		want   []int64
	}{
		{"one replica: its floor", []*ShareOf{floor()}, []int64{1}},
		{"floors everywhere: one kept, on the first", []*ShareOf{floor(), floor(), floor()}, []int64{1, NoSeqs, NoSeqs}},
		{"a part of the split elsewhere", []*ShareOf{floor(), {Cap: 3}}, []int64{NoSeqs, 3}},
		{"no cap elsewhere", []*ShareOf{{Cap: 0}, floor()}, []int64{0, NoSeqs}},
		{"no split elsewhere (nobody else there)", []*ShareOf{floor(), nil}, []int64{NoSeqs, 0}},
		{"none elsewhere, a light tenant waiting there: the floor stays", []*ShareOf{{Cap: NoSeqs}, floor()}, []int64{NoSeqs, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			FloorOnce(c.shares)
			assert.Equal(t, c.want, caps(c.shares))
		})
	}
}

// TestHeavyFloorPerPool: on a pool of two replicas whose light claims at
// the other instance fill both, the flood's instance may start one request
// in the pool, not one on each, and none while a light tenant waits, as
// the dispatch gate on one instance. A replica leaving the fleet is no part
// of the pool. A lone replica keeps the heavy tenants' sequence. The pools
// are the dispatch gate's (Set.PoolOf).
func TestHeavyFloorPerPool(t *testing.T) {
	r0 := &Replica{Name: "r0", MaxSeqs: 4, Pinned: []string{"m"}}
	r1 := &Replica{Name: "r1", MaxSeqs: 4, Pinned: []string{"m", "adapter"}}
	reps, keys := []*Replica{r0, r1}, []string{"r0", "r1"}
	set := newSet(fixedCapacity(map[string]int64{"r0": 1 << 20, "r1": 1 << 20}), reps...)
	mine := []peers.Report{{Replica: "r0", InFlight: 1, Tenants: []peers.TenantDemand{{Tenant: "flood", Weight: 1, Load: 20000, Claim: 4000}}},
		{Replica: "r1", InFlight: 1, Tenants: []peers.TenantDemand{{Tenant: "flood", Weight: 1, Load: 20000, Claim: 4000}}}}
	light := func(queued int64) map[string][]peers.Entry {
		e := peers.Entry{Instance: "b", InFlight: 3, Tenants: []peers.TenantDemand{{Tenant: "v", Weight: 3, Load: 3000, Claim: 4000, Queued: queued}}}
		return map[string][]peers.Entry{"r0": {e}, "r1": {e}}
	}
	ApplyShares("a", reps, keys, set.PoolOf, DefaultReserve, mine, light(0))
	assert.Equal(t, []int64{1, NoSeqs}, []int64{r0.Share.Load(), r1.Share.Load()}, "one request in the pool (an adapter on one replica is the same pool)")
	ApplyShares("a", reps, keys, set.PoolOf, DefaultReserve, mine, light(1000))
	assert.Equal(t, []int64{NoSeqs, NoSeqs}, []int64{r0.Share.Load(), r1.Share.Load()}, "a light tenant waits: none")

	r0.Gone.Store(true)
	ApplyShares("a", reps, keys, set.PoolOf, DefaultReserve, mine, light(0))
	assert.Equal(t, int64(1), r1.Share.Load(), "the replica that takes new work keeps the floor")
	r0.Gone.Store(false)

	r1.Pinned = []string{"other"}
	ApplyShares("a", reps, keys, set.PoolOf, DefaultReserve, mine, light(1000))
	assert.Equal(t, []int64{1, 1}, []int64{r0.Share.Load(), r1.Share.Load()},
		"two pools of one replica: each keeps the heavy tenants' sequence of its batch")
}

// TestSplitPoolMargin: server.reserve_margin sizes the light tenants'
// part as it sizes the gate's reserve. b (light, in flight 1 and 1
// queued: a claim of 2) is given its claim plus margin·√2; the heavy a
// keeps what is left of 8 (at 1, 4.59: the remainder goes to the largest
// fraction), at least the heavy tenants' floor of one.
func TestSplitPoolMargin(t *testing.T) {
	a := peers.Entry{Instance: "a", InFlight: 8, Queued: 8}
	b := []peers.Entry{{Instance: "b", InFlight: 1, Queued: 1}}
	for _, tc := range []struct {
		margin float64
		want   int64
	}{{0, 6}, {1, 5}, {gate.BurstK, 3}, {4, 1}} {
		assert.Equal(t, tc.want, SplitPool(8, 1, Reserve{Margin: tc.margin, Cap: 1}, a, b).Cap, "margin %v", tc.margin)
	}
	assert.Equal(t, SeqShare(8, a, b), SplitPool(8, 1, DefaultReserve, a, b).Cap, "SeqShare takes the default")
}

// TestSplitPoolSteadyAndCap: the split keeps the light tenants what the
// gate's reserve keeps them on one instance. A flood at instance a beside
// a light tenant at b holding 3 of 16 with 1 queued, its claim 6 (3 kept
// for its peak): as a Poisson count it is given 6 + 2·√6 = 10.9, the
// flood 5; read steady by its gate (a closed loop) no margin, the flood
// 10. server.reserve_cap bounds what it is given beyond what it holds
// (queued, kept and margin alike): at 0.25 of 16, 3 + 4, the flood 9;
// at 0, what it holds (the flood's instance keeps 13). Where its part
// is below its claim only by the cap, it is not cut. A version that
// sends no held part is read as holding its claim but its queued part
// (peers), which no cap binds below. server.headroom is the least it is
// given beyond what it holds, as the gate's least reserve.
func TestSplitPoolSteadyAndCap(t *testing.T) {
	flood := peers.Entry{Instance: "a", InFlight: 4, Queued: 60, Tenants: []peers.TenantDemand{{Tenant: "flood", Weight: 1, Load: 64000, Claim: 16000, Queued: 12000, Held: 4000}}}
	light := func(steady bool, held int64) []peers.Entry {
		return []peers.Entry{{Instance: "b", InFlight: 3, Queued: 4, Tenants: []peers.TenantDemand{{Tenant: "v", Weight: 1, Load: 3000, Claim: 6000, Queued: 1000, Held: held, Steady: steady}}}}
	}
	split := func(rs Reserve, steady bool, held int64) ShareOf {
		return SplitPool(16, 1, rs, flood, light(steady, held))
	}
	assert.Equal(t, int64(5), split(DefaultReserve, false, 3000).Cap, "16 − 6 − 2·√6, rounded")
	assert.Equal(t, int64(10), split(DefaultReserve, true, 3000).Cap, "steady: its claim alone")
	assert.Equal(t, int64(9), split(Reserve{Margin: gate.BurstK, Cap: 0.25}, false, 3000).Cap, "3 held + 4 of 16")
	assert.Equal(t, int64(13), split(Reserve{Margin: gate.BurstK, Cap: 0}, false, 3000).Cap, "what it holds")
	assert.Equal(t, int64(11), split(Reserve{Margin: gate.BurstK, Cap: 0}, false, 5000).Cap, "held as an older version reads it: claim less queued")

	// server.headroom is the least it is given beyond what it holds: a
	// steady loop holding its claim of 3 is given 3 + 1.6, the flood 11;
	// without headroom, 13. The cap bounds it too.
	steadyLoop := []peers.Entry{{Instance: "b", InFlight: 3, Tenants: []peers.TenantDemand{{Tenant: "v", Weight: 1, Load: 3000, Claim: 3000, Held: 3000, Steady: true}}}}
	assert.Equal(t, int64(11), SplitPool(16, 1, DefaultReserve, flood, steadyLoop).Cap)
	assert.Equal(t, int64(13), SplitPool(16, 1, Reserve{Margin: gate.BurstK, Cap: 1}, flood, steadyLoop).Cap)
	assert.Equal(t, int64(12), SplitPool(16, 1, Reserve{Margin: gate.BurstK, Headroom: 0.1, Cap: 0.05}, flood, steadyLoop).Cap, "3 + 0.8")

	// At the light tenant's instance: capped, it is not cut, so not bound
	// where it stands.
	mine := light(false, 3000)[0]
	mine.Tenants[0].Stands = true
	sh := SplitPool(16, 1, Reserve{Margin: gate.BurstK, Cap: 0.25}, mine, []peers.Entry{flood})
	assert.Equal(t, []string{"v"}, sh.Light)
	assert.Equal(t, int64(7), sh.Cap)
	sh = SplitPool(16, 1, Reserve{Margin: gate.BurstK, Cap: 0}, mine, []peers.Entry{flood})
	assert.Equal(t, []string{"v"}, sh.Light, "given what it holds, below its claim: not cut")
	assert.Empty(t, sh.Cut)
	assert.Equal(t, int64(3), sh.Cap)
}
