package gpu

import (
	"fmt"
	"slices"
	"time"
)

// repSet is the monitor's replicas in order, and by name. Immutable: a
// membership change stores a new one (under Monitor.mu), so the lock-free
// readers (Capacity, Clock, Estimator, Hold) see one whole set.
type repSet struct {
	reps   []*replica
	byName map[string]*replica
}

// newReplica builds a replica's state with its own clock and estimator.
func (m *Monitor) newReplica(rc Replica, now time.Time) *replica {
	a, b := rc.GPUMsPerInputToken, rc.GPUMsPerOutputToken
	if a == 0 {
		a = m.cfg.GPUMsPerInputToken
	}
	if b == 0 {
		b = m.cfg.GPUMsPerOutputToken
	}
	r := &replica{cfg: rc, g: rc.gpuCount(), clock: NewClock(rc.gpuCount(), now),
		est: NewEstimator(a, b, m.cfg.Forgetting), oc: 1}
	if m.attr != nil {
		r.clock.sink = m.attr.add
	}
	return r
}

// AddReplica adds a replica found at run time (replica discovery). It has
// no capacity until its first scrape is observed, so nothing is routed to
// it before it has answered.
func (m *Monitor) AddReplica(rc Replica) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.set.Load()
	if _, ok := cur.byName[rc.Name]; ok {
		return fmt.Errorf("add replica %q: already present", rc.Name)
	}
	// Validated as a config listing every replica: names and GPUs unique.
	c := m.cfg
	c.Replicas = make([]Replica, 0, len(cur.reps)+1)
	for _, r := range cur.reps {
		c.Replicas = append(c.Replicas, r.cfg)
	}
	c.Replicas = append(c.Replicas, rc)
	if err := c.Validate(); err != nil {
		return err
	}
	now := m.now()
	next := &repSet{reps: append(slices.Clone(cur.reps), m.newReplica(rc, now)), byName: make(map[string]*replica, len(cur.reps)+1)}
	for _, r := range next.reps {
		next.byName[r.cfg.Name] = r
	}
	m.set.Store(next)
	m.publishLocked(now)
	return nil
}

// RemoveReplica forgets a replica and its series. The scheduler removes
// one only once nothing runs on it: a request still holding its clock
// would be charged from a clock no longer exported.
func (m *Monitor) RemoveReplica(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.set.Load()
	if _, ok := cur.byName[name]; !ok {
		return fmt.Errorf("remove %q: %w", name, ErrUnknownReplica)
	}
	next := &repSet{byName: make(map[string]*replica, len(cur.reps))}
	for _, r := range cur.reps {
		if r.cfg.Name != name {
			next.reps = append(next.reps, r)
			next.byName[r.cfg.Name] = r
		}
	}
	m.set.Store(next)
	if m.met != nil {
		for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.met.capacity, m.met.repState, m.met.overcommit, m.met.repStale} {
			v.DeleteLabelValues(name)
		}
	}
	m.publishLocked(m.now())
	return nil
}
