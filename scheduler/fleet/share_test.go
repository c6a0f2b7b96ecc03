package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/peers"
)

// TestSeqShare: the split by instance where reports carry no tenants (an
// older version's), and by the tenants' weights where they do.
func TestSeqShare(t *testing.T) {
	e := func(id string, in, q int64) peers.Entry { return peers.Entry{Instance: id, InFlight: in, Queued: q} }
	td := func(name string, w int64, demand float64) peers.TenantDemand {
		return peers.TenantDemand{Tenant: name, Weight: w, Held: int64(demand * 1000)}
	}
	te := func(id string, ts ...peers.TenantDemand) peers.Entry { return peers.Entry{Instance: id, Tenants: ts} }
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
		{"an other needing less keeps it, the rest is ours", 8, e("a", 8, 8), []peers.Entry{e("b", 1, 1)}, 6},
		{"an idle other leaves all", 4, e("a", 2, 0), []peers.Entry{e("b", 0, 0)}, 4},
		{"water-filling over three: a keeps 1, b and c split 9 (b first)", 10, e("c", 20, 0), []peers.Entry{e("a", 1, 0), e("b", 20, 0)}, 4},
		{"water-filling over three, seen by b", 10, e("b", 20, 0), []peers.Entry{e("a", 1, 0), e("c", 20, 0)}, 5},
		{"more instances than sequences: at least one", 2, e("z", 9, 9), []peers.Entry{e("a", 9, 9), e("b", 9, 9), e("c", 9, 9)}, 1},
		{"a report past any sum counts as max_num_seqs", 4, e("a", 1<<62, 1<<62), []peers.Entry{e("b", 1<<62, 1<<62)}, 2},
		{"nothing asked here: the floor", 8, e("a", 0, 0), []peers.Entry{e("b", 8, 8)}, 1},

		// The isolation row across instances: three light tenants asking
		// 3.2 each of 16 at b, a flood at a. Split by instance each would
		// get 8; by tenant the light ones get their 9.6.
		{"light tenants at one instance keep their demand", 16,
			te("b", td("v1", 1, 3.2), td("v2", 1, 3.2), td("v3", 1, 3.2)), []peers.Entry{te("a", td("flood", 1, 16))}, 10},
		{"and the flood's instance the rest", 16,
			te("a", td("flood", 1, 16)), []peers.Entry{te("b", td("v1", 1, 3.2), td("v2", 1, 3.2), td("v3", 1, 3.2))}, 6},
		{"weights: 4 to 1", 10, te("a", td("big", 4, 10)), []peers.Entry{te("b", td("small", 1, 10))}, 8},
		{"a tenant at two instances is one claimant, split by its demand there", 8,
			te("a", td("acme", 1, 8), td("beta", 1, 8)), []peers.Entry{te("b", td("acme", 1, 8))}, 6},
		{"the same, seen by b", 8, te("b", td("acme", 1, 8)), []peers.Entry{te("a", td("acme", 1, 8), td("beta", 1, 8))}, 2},
		{"weights that disagree (a reload on its way): the larger", 10,
			te("a", td("big", 1, 10)), []peers.Entry{te("b", td("big", 4, 10), td("small", 1, 10))}, 4},
		{"an older version's report is one claimant of weight 1", 8, te("a", td("x", 3, 8)), []peers.Entry{e("b", 8, 0)}, 6},
		{"what no tenant claims is ours", 16, te("a", td("x", 1, 2)), []peers.Entry{te("b", td("y", 1, 3))}, 13},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, SeqShare(c.max, c.mine, c.others))
		})
	}
}

// TestSeqShareAgainstProgressiveFilling: over seeded fleets (2–5 instances,
// 1–6 tenants of weight 1–4 reaching random instances with random demand,
// batches of 1–64), each instance's share is its part of the weighted
// max-min split computed independently by progressive filling (every
// unsatisfied tenant's allocation raised in small steps in proportion to
// its weight until the batch is spent), within one for rounding; and
// where the batch is all claimed and no instance is at the floor, the
// shares the instances compute from the same reports sum to the batch.
func TestSeqShareAgainstProgressiveFilling(t *testing.T) {
	for seed := range uint64(500) {
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
				d := rng.Int64N(maxSeqs*1000 + 1)
				if rng.IntN(3) == 0 {
					d = maxSeqs * 1000 * (1 + rng.Int64N(3)) // backlogged
				}
				entries[i].Tenants = append(entries[i].Tenants,
					peers.TenantDemand{Tenant: fmt.Sprintf("t%d", j), Weight: weights[j], Waiting: d})
			}
			if len(entries[i].Tenants) == 0 {
				entries[i].Tenants = []peers.TenantDemand{{Tenant: "t0", Weight: weights[0], Held: 1}}
			}
		}
		part, claimed := progressiveFill(maxSeqs, entries)
		var sum int64
		floored := false
		for i, mine := range entries {
			others := slices.Concat(entries[:i], entries[i+1:])
			got := SeqShare(maxSeqs, mine, others)
			want := part[mine.Instance]
			if !claimed {
				want = float64(maxSeqs) - (claimedSum(part) - want) // ours: all that is not claimed
			}
			floored = floored || want < 1
			require.InDeltaf(t, want, float64(got), 1+1e-6, "seed %d instance %s: share %d, part %.3f (max %d)", seed, mine.Instance, got, want, maxSeqs)
			sum += got
		}
		if claimed && !floored {
			require.Equalf(t, maxSeqs, sum, "seed %d: the shares sum to the batch", seed)
		}
	}
}

// progressiveFill is the weighted max-min split of maxSeqs over the
// entries' tenants, by raising every unsatisfied tenant's allocation in
// steps of 1/2000 of a request per unit of weight, each tenant's part
// going to its instances in proportion to their demand; claimed reports
// whether the tenants' demand takes the whole batch.
func progressiveFill(maxSeqs int64, entries []peers.Entry) (map[string]float64, bool) {
	limit := float64(maxSeqs)
	demand, weight := map[string]float64{}, map[string]float64{}
	for _, e := range entries {
		for _, td := range e.Tenants {
			demand[td.Tenant] += float64(td.Demand()) / 1000
			weight[td.Tenant] = max(weight[td.Tenant], float64(td.Weight))
		}
	}
	total := 0.0
	for n := range demand {
		demand[n] = min(demand[n], limit)
		total += demand[n]
	}
	alloc := map[string]float64{}
	spent := 0.0
	for spent < limit-1e-9 {
		active := 0.0
		for n := range demand {
			if alloc[n] < demand[n] {
				active += weight[n]
			}
		}
		if active == 0 {
			break
		}
		step := min(1.0/2000, (limit-spent)/active)
		for n := range demand {
			if alloc[n] < demand[n] {
				add := min(step*weight[n], demand[n]-alloc[n])
				alloc[n] += add
				spent += add
			}
		}
	}
	part := map[string]float64{}
	for _, e := range entries {
		for _, td := range e.Tenants {
			sum := 0.0
			for _, o := range entries {
				for _, x := range o.Tenants {
					if x.Tenant == td.Tenant {
						sum += float64(min(x.Demand(), maxSeqs*1000))
					}
				}
			}
			part[e.Instance] += alloc[td.Tenant] * float64(min(td.Demand(), maxSeqs*1000)) / sum
		}
	}
	return part, total >= limit-1e-9 && math.Abs(spent-limit) < 1e-6
}

func claimedSum(part map[string]float64) float64 {
	s := 0.0
	for _, v := range part {
		s += v
	}
	return s
}
