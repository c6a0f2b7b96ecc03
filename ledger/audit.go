package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Audit recomputes invariant I5 for every tenant without changing anything:
// r equals the sum of holds of open records, n the number of DISPATCHED
// records holding a slot, c the charges of records admitted (and charged) in
// the counter's current window, plus purged charges and admin adjustments;
// heaps and the record map agree. It returns nil when clean, or an error
// wrapping ErrCorrupt that lists every drift. It is safe for concurrent use.
func (m *Memory) Audit() error {
	m.mu.RLock()
	ts := make([]*tenantState, 0, len(m.tenants))
	for _, t := range m.tenants {
		ts = append(ts, t)
	}
	m.mu.RUnlock()
	var errs []error
	for _, t := range ts {
		t.mu.Lock()
		errs = append(errs, m.auditLocked(t)...)
		t.mu.Unlock()
	}
	errs = append(errs, m.auditGlobal()...)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: audit: %w", ErrCorrupt, errors.Join(errs...))
}

func (m *Memory) auditLocked(t *tenantState) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("tenant %s: "+format, append([]any{t.key}, args...)...))
	}
	now := t.now(m.clock().UnixMilli())
	type want struct {
		r Amounts
		n int64
	}
	wants := make(map[*scopeState]*want, len(t.scopes))
	for _, s := range t.scopes {
		wants[s] = &want{}
	}
	unres := 0
	for id, rec := range t.records {
		if rec.id != id {
			bad("record keyed %s holds id %s", id, rec.id)
		}
		if rec.state < Reserved || rec.state > SettledLate {
			bad("record %s in unknown state %d", id, rec.state)
			continue
		}
		if err := t.checkHeap(rec); err != nil {
			bad("record %s (%s): %v", id, rec.state, err)
		}
		if rec.state == Unresolved {
			unres++
		}
		for i := 0; i < rec.nscopes; i++ {
			if rec.refs[i].Kind == KindGlobal {
				continue // audited across tenants by auditGlobal
			}
			w := wants[rec.scopes[i]]
			if w == nil {
				bad("record %s points at an unknown scope", id)
				continue
			}
			if rec.state.Open() {
				for d := range NumDims {
					if !d.Windowed() {
						continue
					}
					w.r[d] += rec.held[d]
				}
			}
			if rec.state == Dispatched && rec.slotMax[i] >= 0 {
				w.n++
			}
		}
	}
	for i, rec := range t.leases {
		if rec.heapIdx != i || t.records[rec.id] != rec || (rec.state != Reserved && rec.state != Dispatched) {
			bad("lease heap entry %d (%s) has no matching open record", i, rec.id)
		}
	}
	for i, rec := range t.unres {
		if rec.heapIdx != i || t.records[rec.id] != rec || rec.state != Unresolved {
			bad("unresolved heap entry %d (%s) has no matching record", i, rec.id)
		}
	}
	if unres != len(t.unres) {
		bad("%d unresolved records, %d in the heap", unres, len(t.unres))
	}
	for key, s := range t.scopes {
		w := wants[s]
		for d := range NumDims {
			if !d.Windowed() {
				continue
			}
			if s.r[d] != w.r[d] {
				bad("scope %s %s: r = %d, open holds sum to %d", key, d, s.r[d], w.r[d])
			}
		}
		if s.n != w.n {
			bad("scope %s: n = %d, %d dispatched records", key, s.n, w.n)
		}
		for k := range s.counters {
			c := &s.counters[k]
			cur := floorDiv(now, c.wms)
			if c.idx > cur {
				bad("scope %s %s/%dms: window index %d ahead of %d", key, c.dim, c.wms, c.idx, cur)
				continue
			}
			got, exp := int64(0), int64(0)
			if c.idx == cur {
				got, exp = c.c, c.purged+c.adjust
			}
			for _, rec := range t.records {
				if rec.chargedSeq == 0 || rec.chargedSeq < c.since || !rec.hasScope(s) {
					continue
				}
				if floorDiv(rec.admitAt, c.wms) == cur && floorDiv(rec.chargedAt, c.wms) == cur {
					exp += rec.charged[c.dim]
				}
			}
			if got != exp {
				bad("scope %s %s per %s: c = %d, charges sum to %d", key, c.dim, FormatWindow(time.Duration(c.wms)*time.Millisecond), got, exp)
			}
		}
	}
	return errs
}

func (rec *record) hasScope(s *scopeState) bool {
	for i := 0; i < rec.nscopes; i++ {
		if rec.scopes[i] == s {
			return true
		}
	}
	return false
}

// AuditTenant is [Memory.Audit] for one tenant (nil for an unknown tenant).
// For the key of a global scope it audits the global partition.
func (m *Memory) AuditTenant(tenant ScopeKey) error {
	m.glob.mu.Lock()
	_, global := m.glob.scopes[tenant]
	m.glob.mu.Unlock()
	if global {
		return m.AuditGlobal()
	}
	t := m.tenant(tenant, false)
	if t == nil {
		return nil
	}
	t.mu.Lock()
	errs := m.auditLocked(t)
	t.mu.Unlock()
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: audit: %w", ErrCorrupt, errors.Join(errs...))
}

// Dump renders everything the ledger stores for a tenant (hwm, policy
// version, every scope's counters and every record) as deterministic text,
// so tests can assert that a refused call changed nothing. Lease heap order is
// not part of it.
func (m *Memory) Dump(tenant ScopeKey) string {
	t := m.tenant(tenant, false)
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "hwm=%d pv=%d\n", t.hwm, t.pv)
	keys := make([]ScopeKey, 0, len(t.scopes))
	for k := range t.scopes {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b ScopeKey) int { return bytes.Compare(a[:], b[:]) })
	for _, k := range keys {
		s := t.scopes[k]
		fmt.Fprintf(&b, "scope %s %s r=%v n=%d limits=%v\n", k, s.kind, s.r, s.n, s.limits)
		for _, c := range s.counters {
			fmt.Fprintf(&b, "  c %s/%d idx=%d c=%d\n", c.dim, c.wms, c.idx, c.c)
		}
	}
	ids := make([]RequestID, 0, len(t.records))
	for id := range t.records {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b RequestID) int { return bytes.Compare(a[:], b[:]) })
	for _, id := range ids {
		r := t.records[id]
		fmt.Fprintf(&b, "rec %s %s owner=%s lease=%d admit=%d held=%v actual=%v charged=%v src=%s late=%v purge=%d\n",
			id, r.state, r.owner, r.leaseExp, r.admitAt, r.held, r.actual, r.charged, r.source, r.late, r.purgeAt)
	}
	return b.String()
}

// auditGlobal checks the global partition: r of every global scope equals
// the holds of the open records of every tenant that carry it. It stops every
// tenant (key order, then the global lock) for a consistent cut. Global c is
// not recomputed: charges of purged tombstones are not tracked for global
// counters (the exact-count tests check c instead).
func (m *Memory) auditGlobal() []error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ts := make([]*tenantState, 0, len(m.tenants))
	for _, t := range m.tenants {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b *tenantState) int { return bytes.Compare(a.key[:], b.key[:]) })
	for _, t := range ts {
		t.mu.Lock()
	}
	defer func() {
		for _, t := range ts {
			t.mu.Unlock()
		}
	}()
	m.glob.mu.Lock()
	defer m.glob.mu.Unlock()
	want := make(map[*scopeState]*Amounts, len(m.glob.scopes))
	for _, s := range m.glob.scopes {
		want[s] = new(Amounts)
	}
	var errs []error
	for _, t := range ts {
		for id, rec := range t.records {
			if !rec.global || !rec.state.Open() {
				continue
			}
			for i := 0; i < rec.nscopes; i++ {
				if rec.refs[i].Kind != KindGlobal {
					continue
				}
				w := want[rec.scopes[i]]
				if w == nil {
					errs = append(errs, fmt.Errorf("tenant %s record %s points at an unknown global scope", t.key, id))
					continue
				}
				for d := range NumDims {
					if !d.Windowed() {
						continue
					}
					w[d] += rec.held[d]
				}
			}
		}
	}
	for key, s := range m.glob.scopes {
		for d := range NumDims {
			if !d.Windowed() {
				continue
			}
			if s.r[d] != want[s][d] {
				errs = append(errs, fmt.Errorf("global scope %s %s: r = %d, open holds sum to %d", key, d, s.r[d], want[s][d]))
			}
		}
	}
	return errs
}

// AuditGlobal is [Memory.Audit] for the global partition only.
func (m *Memory) AuditGlobal() error {
	if errs := m.auditGlobal(); len(errs) > 0 {
		return fmt.Errorf("%w: audit: %w", ErrCorrupt, errors.Join(errs...))
	}
	return nil
}
