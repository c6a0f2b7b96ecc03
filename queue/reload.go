package queue

import (
	"cmp"
	"fmt"
	"slices"
)

// Prepare validates cfg and returns a commit function that applies it; it
// has no side effects itself (the two-phase reload of HOUSE-STYLE §3).
// Commit keeps every queued entry:
//   - a new tenant starts with no backlog and joins at the band minimum;
//   - a kept tenant takes its new weight, bounds, wait, band and order at
//     once (queued entries keep their band and deadline; a new order
//     re-sorts its queued entries; counters are kept);
//   - a removed tenant refuses new requests with [ErrUnknownTenant] but its
//     queued entries are still dispatched, expired or cancelled as before,
//     at its last weight; it is forgotten once it has nothing queued or
//     pending. Reconcile for a forgotten tenant is a no-op.
//
// Global bounds apply to later arrivals; entries already queued over a
// lowered bound stay.
func (q *Queue[T]) Prepare(cfg Config) (commit func(), err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("queue config: %w", err)
	}
	c := cfg.withDefaults()
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.applyLocked(c)
	}, nil
}

// Reconfigure is [Queue.Prepare] followed by its commit.
func (q *Queue[T]) Reconfigure(cfg Config) error {
	commit, err := q.Prepare(cfg)
	if err != nil {
		return err
	}
	commit()
	return nil
}

func (q *Queue[T]) applyLocked(c Config) {
	q.cfg = c
	keep := make(map[string]struct{}, len(c.Tenants))
	for _, tc := range c.Tenants {
		keep[tc.Name] = struct{}{}
		t := q.tenants[tc.Name]
		if t == nil {
			q.tenants[tc.Name] = &tenant[T]{cfg: tc, pidx: -1}
			continue
		}
		reorder := t.cfg.Order != tc.Order
		t.cfg = tc
		t.removed = false
		if reorder {
			for _, f := range t.flows {
				if f != nil {
					for i := range f.entries.s {
						f.entries.s[i].k = entryKey(f.entries.s[i].p)
					}
					f.entries.init()
				}
			}
		}
	}
	for name, t := range q.tenants {
		if _, ok := keep[name]; !ok {
			t.removed = true
			q.maybeDropLocked(t)
		}
	}
	q.signalReady()
	q.signalRearm()
}

// TenantStats is a snapshot of one tenant's queue state and counters.
type TenantStats struct {
	Name string
	// Depth, Bytes and QueuedCost are what the tenant has queued now.
	Depth      int
	Bytes      int64
	QueuedCost int64
	// Charged is the tenant's charged service S in cost units: predicted
	// costs at dispatch plus reconciliations, minus requeued charges.
	Charged int64
	// Pending counts entries dispatched and not yet released or requeued.
	Pending int
	// Parked and Removed report the tenant's state.
	Parked  bool
	Removed bool
	// Event counters since the tenant was first configured.
	Enqueued   uint64
	Rejected   uint64
	Dispatched uint64
	Expired    uint64 // at their deadlines
	Shed       uint64 // by the tenant's shed_after, before their deadlines
	Cancelled  uint64
	Requeued   uint64
	TakenBack  uint64 // dispatched, then taken back from a replica (Queue.TakeBack)
	Parks      uint64
}

func (t *tenant[T]) stats() TenantStats {
	s := t.counters
	s.Name = t.cfg.Name
	s.Depth = t.depth
	s.Bytes = t.bytes
	s.QueuedCost = t.cost
	s.Charged = t.charged
	s.Pending = t.pending
	s.Dispatched = t.dispatched
	s.Parked = t.parked
	s.Removed = t.removed
	return s
}

// Stats returns one tenant's snapshot, false when the tenant is unknown.
func (q *Queue[T]) Stats(tenant string) (TenantStats, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil {
		return TenantStats{}, false
	}
	return t.stats(), true
}

// AppendStats appends every known tenant's snapshot to dst, sorted by name,
// and returns the extended slice. Reusing dst avoids allocation.
func (q *Queue[T]) AppendStats(dst []TenantStats) []TenantStats {
	q.mu.Lock()
	start := len(dst)
	for _, t := range q.tenants {
		dst = append(dst, t.stats())
	}
	q.mu.Unlock()
	slices.SortFunc(dst[start:], func(a, b TenantStats) int { return cmp.Compare(a.Name, b.Name) })
	return dst
}

// Len returns the queued entries and body bytes of all tenants together.
func (q *Queue[T]) Len() (depth int, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.depth, q.bytes
}

// Counter returns a flow's virtual counter (cost units per unit weight), for
// tests and debugging; false when the flow does not exist.
func (q *Queue[T]) Counter(tenant string, band int) (float64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil || band < 0 || band >= NumBands || t.flows[band] == nil {
		return 0, false
	}
	return t.flows[band].v, true
}
