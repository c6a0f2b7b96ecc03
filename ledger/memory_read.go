package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Snapshot implements [Ledger.Snapshot]. It reads without writing (ledger
// time is not raised).
func (m *Memory) Snapshot(ctx context.Context, tenant, scope ScopeKey) (Usage, error) {
	if err := ctx.Err(); err != nil {
		return Usage{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if scope == tenant {
		// Snapshot(G, G) of a global scope key G reads the global partition.
		m.glob.mu.Lock()
		if s := m.glob.scopes[scope]; s != nil {
			now := max(m.clock().UnixMilli(), m.glob.hwm)
			u := Usage{Now: time.UnixMilli(now).UTC()}
			fillUsage(&u, s, now)
			m.glob.mu.Unlock()
			return u, nil
		}
		m.glob.mu.Unlock()
	}
	t := m.tenant(tenant, false)
	if t == nil {
		return Usage{Now: m.clock().Truncate(time.Millisecond).UTC()}, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now(m.clock().UnixMilli())
	u := Usage{Now: time.UnixMilli(now).UTC(), PolicyVersion: t.pv}
	if scope == tenant {
		u.Unresolved = len(t.unres)
	}
	s := t.scopes[scope]
	if s == nil {
		return u, nil
	}
	fillUsage(&u, s, now)
	return u, nil
}

// fillUsage fills u from one scope's state at now.
func fillUsage(u *Usage, s *scopeState, now int64) {
	u.Scope, u.Reserved, u.SlotsInUse = s.kind, s.r, s.n
	u.Limits = make([]LimitUsage, 0, len(s.limits))
	for _, l := range s.limits {
		lu := LimitUsage{Limit: l}
		if l.Dim == Slots {
			lu.Reserved = s.n
		} else {
			wms := l.Window.Milliseconds()
			lu.Committed, lu.Reserved = s.committed(l.Dim, wms, now), s.r[l.Dim]
			lu.ResetsAt = WindowResetsAt(floorDiv(now, wms), l.Window)
		}
		lu.Remaining = max(l.Max-lu.Committed-lu.Reserved, 0)
		u.Limits = append(u.Limits, lu)
	}
}

// Committed returns c of (scope, dim, window) in the current window: a
// convenience for tests and the admin API.
func (m *Memory) Committed(tenant, scope ScopeKey, dim Dim, window time.Duration) int64 {
	t := m.tenant(tenant, false)
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scopes[scope]
	if s == nil {
		return 0
	}
	return s.committed(dim, window.Milliseconds(), t.now(m.clock().UnixMilli()))
}

// List implements [Ledger.List]: a read-only copy of up to max open records
// of one state, ordered by lease expiry (UNRESOLVED: by chargeable-at), ties
// by the id's base64url form (the order of the Redis backend's ZSETs). It
// holds the tenant's lock while it copies, so the answer is one consistent
// cut, and costs O(open records of the tenant · log).
func (m *Memory) List(ctx context.Context, tenant ScopeKey, state State, limit int) ([]ReservationInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !state.Open() {
		return nil, fmt.Errorf("list state %s: only reserved, dispatched or unresolved: %w", state, ErrInvalid)
	}
	if limit <= 0 {
		limit = DefaultListMax
	}
	t := m.tenant(tenant, false)
	if t == nil {
		return nil, nil
	}
	type item struct {
		key int64
		id  string
		rec ReservationInfo
	}
	var items []item
	t.mu.Lock()
	var src []*record
	if state == Unresolved {
		src = t.unres
	} else {
		src = t.leases
	}
	for _, rec := range src {
		if rec.state != state {
			continue
		}
		key := rec.leaseExp
		if state == Unresolved {
			key = rec.resolveAt
		}
		items = append(items, item{key: key, id: ScopeKey(rec.id).String(), rec: ReservationInfo{
			Ref: Ref{Tenant: tenant, ID: rec.id}, State: rec.state, Held: rec.held,
			LeaseExpiry: time.UnixMilli(rec.leaseExp).UTC(), AdmittedAt: time.UnixMilli(rec.admitAt).UTC(), Owner: rec.owner}})
	}
	t.mu.Unlock()
	slices.SortFunc(items, func(a, b item) int {
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	if len(items) > limit {
		items = items[:limit]
	}
	out := make([]ReservationInfo, len(items))
	for i := range items {
		out[i] = items[i].rec
	}
	return out, nil
}
