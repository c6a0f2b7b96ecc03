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
type Members struct {
	reps   []*Replica
	byName map[string]*Replica
}

// List is the members. The slice is shared: do not modify it.
func (l *Members) List() []*Replica {
	if l == nil {
		return nil
	}
	return l.reps
}

// List is the current members. The slice is shared: do not modify it.
func (s *Set) List() []*Replica { return s.members.Load().List() }

// Current is the current members as one value: the same pointer until a
// replica joins or leaves.
func (s *Set) Current() *Members { return s.members.Load() }

// Get is the member named name, or nil.
func (s *Set) Get(name string) *Replica {
	if l := s.members.Load(); l != nil {
		return l.byName[name]
	}
	var none *Replica
	return none
}

// SetMembers stores reps as the members. Callers serialise (the centre's
// membership lock, or tests).
func (s *Set) SetMembers(reps []*Replica) {
	l := &Members{reps: reps, byName: make(map[string]*Replica, len(reps))}
	for _, r := range reps {
		l.byName[r.Name] = r
	}
	s.members.Store(l)
}

// FreeSlot is the lowest slot no member of reps holds.
func FreeSlot(reps []*Replica) int {
	for i := 0; ; i++ {
		if !slices.ContainsFunc(reps, func(r *Replica) bool { return r.Slot == i }) {
			return i
		}
	}
}

// MarkGone takes r out of every choice and reports whether it was already
// out. Under the set's lock: a pick that reserved room on r before this is
// counted in r's Count, one after it sees Gone.
func (s *Set) MarkGone(r *Replica) (was bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.Gone.Swap(true)
}

// Reap removes the members that left and have nothing in flight, and
// returns their names. Callers serialise with SetMembers.
func (s *Set) Reap() []string {
	cur := s.List()
	var gone []string
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := slices.DeleteFunc(slices.Clone(cur), func(r *Replica) bool {
		if f := r; f.Gone.Load() && f.Count.Load() == 0 {
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
func (s *Set) Targets() []vllm.Target {
	reps := s.List()
	out := make([]vllm.Target, len(reps))
	for i, r := range reps {
		out[i] = vllm.Target{Name: r.Name, URL: r.URL}
	}
	return out
}

// Names is the members' names, leaving ones included.
func (s *Set) Names() []string {
	reps := s.List()
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.Name
	}
	return out
}

// Lock holds off every choice and membership change until Unlock, so that
// the centre's gate reads the members' loads as one state, as pick does.
func (s *Set) Lock() { s.mu.Lock() }

// Unlock ends Lock.
func (s *Set) Unlock() { s.mu.Unlock() }
