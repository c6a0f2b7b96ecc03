package fleet

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/gpu"
)

// testRep is a Member whose batch is its requests in flight, up to
// MaxSeqs: the centre's estimate before any scrape.
type testRep struct {
	Replica
	sent atomic.Int64
}

func (r *testRep) Seqs(bool) int64                    { return r.Count.Load() }
func (r *testRep) BatchLimit() int64                  { return r.MaxSeqs }
func (r *testRep) NextSeq() int64                     { return r.sent.Add(1) }
func (r *testRep) Leave(_ int64, _ bool, _ time.Time) { r.Count.Add(-1) }

func rep(name string, maxSeqs int64) *testRep {
	return &testRep{Replica: Replica{Name: name, MaxSeqs: maxSeqs}}
}

// newSet is a set of reps, each in the slot of its position.
func newSet(capacity CapacityFunc, reps ...*testRep) *Set[*testRep] {
	s := NewSet[*testRep](capacity)
	for i, r := range reps {
		r.Slot = i
	}
	s.SetMembers(reps)
	return s
}

// fixedCapacity sizes every replica the same.
func fixedCapacity(k map[string]int64) CapacityFunc {
	return func(name string) (int64, int64, gpu.State) {
		if v, ok := k[name]; ok {
			return v, v, gpu.StateHealthy
		}
		return 0, 0, gpu.StateDown
	}
}

// choose takes room for a request, nil when nothing fits.
func (s *Set[M]) choose(rt Route, size int64, exclude M) M {
	r, _ := s.Take(rt, size, exclude)
	return r
}

// pick0 chooses without reserving.
func (s *Set[M]) pick0(rt Route, size int64) M {
	var none M
	r, _ := s.pick(rt, size, none, false)
	return r
}
