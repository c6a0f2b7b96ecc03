package fleet

import (
	"github.com/sluicehq/sluice/gpu"
)

func rep(name string, maxSeqs int64) *Replica {
	return &Replica{Name: name, MaxSeqs: maxSeqs}
}

// newSet is a set of reps, each in the slot of its position.
func newSet(capacity CapacityFunc, reps ...*Replica) *Set {
	s := NewSet(capacity)
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
func (s *Set) choose(rt Route, size int64, exclude *Replica) *Replica {
	r, _ := s.Take(rt, size, exclude)
	return r
}

// pick0 chooses without reserving.
func (s *Set) pick0(rt Route, size int64) *Replica {
	var none *Replica
	r, _ := s.pick(rt, size, none, false)
	return r
}
