package fleet

import (
	"slices"

	"github.com/sluicehq/sluice/vllm"
)

// Replicas join and leave at run time through replica discovery
// (scheduler/discovery): one that leaves is marked gone (MarkGone), which
// takes it out of every choice at once (pick and the gate read Gone under
// the set's lock), lets what runs there finish and settle as usual (a call
// keeps its replica to the end), and is removed once nothing is in flight
// there (Reap).

// Members is the members of a Set, in the order they joined (config order
// first). Immutable.
type Members[M Member] struct {
	reps   []M
	byName map[string]M
}

// List is the members. The slice is shared: do not modify it.
func (l *Members[M]) List() []M {
	if l == nil {
		return nil
	}
	return l.reps
}

// List is the current members. The slice is shared: do not modify it.
func (s *Set[M]) List() []M { return s.members.Load().List() }

// Current is the current members as one value: the same pointer until a
// replica joins or leaves.
func (s *Set[M]) Current() *Members[M] { return s.members.Load() }

// Get is the member named name, or the zero M.
func (s *Set[M]) Get(name string) M {
	if l := s.members.Load(); l != nil {
		return l.byName[name]
	}
	var none M
	return none
}

// SetMembers stores reps as the members. Callers serialise (the centre's
// membership lock, or tests).
func (s *Set[M]) SetMembers(reps []M) {
	l := &Members[M]{reps: reps, byName: make(map[string]M, len(reps))}
	for _, r := range reps {
		l.byName[r.Fleet().Name] = r
	}
	s.members.Store(l)
}

// FreeSlot is the lowest slot no member of reps holds.
func FreeSlot[M Member](reps []M) int {
	for i := 0; ; i++ {
		if !slices.ContainsFunc(reps, func(r M) bool { return r.Fleet().Slot == i }) {
			return i
		}
	}
}

// MarkGone takes r out of every choice and reports whether it was already
// out. Under the set's lock: a pick that reserved room on r before this is
// counted in r's Count, one after it sees Gone.
func (s *Set[M]) MarkGone(r M) (was bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.Fleet().Gone.Swap(true)
}

// Reap removes the members that left and have nothing in flight, and
// returns their names. Callers serialise with SetMembers.
func (s *Set[M]) Reap() []string {
	cur := s.List()
	var gone []string
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := slices.DeleteFunc(slices.Clone(cur), func(r M) bool {
		if f := r.Fleet(); f.Gone.Load() && f.Count.Load() == 0 {
			gone = append(gone, f.Name)
			return true
		}
		return false
	})
	if len(gone) > 0 {
		s.SetMembers(keep)
	}
	return gone
}

// Targets is every member as the poller scrapes it, leaving ones
// included (their requests still run).
func (s *Set[M]) Targets() []vllm.Target {
	reps := s.List()
	out := make([]vllm.Target, len(reps))
	for i, r := range reps {
		out[i] = vllm.Target{Name: r.Fleet().Name, URL: r.Fleet().URL}
	}
	return out
}

// Names is the members' names, leaving ones included.
func (s *Set[M]) Names() []string {
	reps := s.List()
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.Fleet().Name
	}
	return out
}

// Lock holds off every choice and membership change until Unlock, so that
// the centre's gate reads the members' loads as one state, as pick does.
func (s *Set[M]) Lock() { s.mu.Lock() }

// Unlock ends Lock.
func (s *Set[M]) Unlock() { s.mu.Unlock() }
