package ledger

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Writes outside a request's lifecycle: an operator's adjustment of a
// committed counter, and a charge of usage no reservation held (outage
// admissions).

// Adjust is the journaled admin correction of a committed counter: it adds
// delta (possibly negative) to c of (scope, dim, window) in the current
// window. It is the only way c decreases (I6). The result must stay within
// 0..2^53−1 (ErrInvalid otherwise); a scope or limit never seen is ErrNotFound.
func (m *Memory) Adjust(ctx context.Context, tenant, scope ScopeKey, dim Dim, window time.Duration, delta int64) error {
	if err := m.ready(ctx); err != nil {
		return err
	}
	t := m.lockTenant(Ref{Tenant: tenant})
	e := entry{op: opAdjust, ref: Ref{Tenant: tenant}, scope: scope, dim: dim, ttl: window.Milliseconds(), max: delta,
		time: t.now(m.clock().UnixMilli())}
	seq, err := m.adjustLocked(t, &e)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	return m.finish(seq)
}

func (m *Memory) adjustLocked(t *tenantState, e *entry) (uint64, error) {
	s := t.scopes[e.scope]
	if s == nil || e.ttl <= 0 {
		return 0, fmt.Errorf("adjust: unknown scope: %w", ErrNotFound)
	}
	c := s.counter(e.dim, e.ttl)
	if c == nil {
		return 0, fmt.Errorf("adjust: scope has no %s limit per %s: %w", e.dim, FormatWindow(time.Duration(e.ttl)*time.Millisecond), ErrNotFound)
	}
	cur := floorDiv(e.time, e.ttl)
	base := c.c
	if c.idx != cur {
		base = 0
	}
	if v := base + e.max; v < 0 || v > MaxCounter {
		return 0, fmt.Errorf("adjust %s by %d gives %d: %w", e.dim, e.max, v, ErrInvalid)
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = e.time
	if c.idx != cur {
		*c = counter{dim: c.dim, wms: c.wms, idx: cur, since: c.since}
	}
	c.c += e.max
	c.adjust += e.max
	return seq, nil
}

// Charge implements [Ledger.Charge]: it commits usage admitted while the
// ledger was unreachable, exactly once by Ref.ID, never denied. The record
// is a SETTLED tombstone with no hold (source outage) admitted at At, so the
// charge reaches exactly the counters whose current window contains At, and
// Audit recomputes it like any settlement. It is journaled like a Reserve.
func (m *Memory) Charge(ctx context.Context, req ChargeRequest) (Settlement, error) {
	if err := m.ready(ctx); err != nil {
		return Settlement{}, err
	}
	if err := req.Validate(); err != nil {
		return Settlement{}, err
	}
	r := req.asReserve()
	t := m.tenant(req.Ref.Tenant, true)
	e := entry{op: opCharge, ref: req.Ref, req: &r}
	t.mu.Lock()
	gl := m.lockGlobalReq(t, &r)
	e.time = m.nowLocked(t, gl)
	e.ttl = min(req.At.UnixMilli(), e.time)
	var ev UsageEvent
	st, seq, err := m.chargeLocked(t, &e, &ev)
	m.unlockGlobal(gl, e.time)
	t.mu.Unlock()
	return m.acknowledge(st, seq, err, &ev)
}

func (m *Memory) chargeLocked(t *tenantState, e *entry, ev *UsageEvent) (Settlement, uint64, error) {
	req, now, at := e.req, e.time, e.ttl
	a := req.Held
	digest := req.Digest()
	if rec := t.records[req.Ref.ID]; rec != nil {
		if err := checkRecord(rec); err != nil {
			return Settlement{}, 0, m.corrupt(t, req.Ref, err)
		}
		if rec.source != SourceOutage || rec.state != Settled {
			return Settlement{}, 0, fmt.Errorf("charge %s: the id names a reservation: %w", req.Ref.ID, ErrConflict)
		}
		if rec.digest != digest {
			return Settlement{}, 0, fmt.Errorf("charge %s: different payload: %w", req.Ref.ID, ErrConflict)
		}
		return Settlement{State: Settled, Charged: rec.actual, Replayed: true}, 0, nil
	}
	// Validate every counter this charge touches before any write (I7).
	var ss [MaxScopes]*scopeState
	for i := range req.Scopes {
		s := m.scopeOf(t, &req.Scopes[i])
		ss[i] = s
		if s == nil {
			continue
		}
		if err := checkScope(s); err != nil {
			return Settlement{}, 0, m.corrupt(t, req.Ref, err)
		}
		for k := range s.counters {
			c := &s.counters[k]
			cur := floorDiv(now, c.wms)
			if c.idx > cur {
				return Settlement{}, 0, m.corrupt(t, req.Ref, fmt.Errorf("committed %s window index %d ahead of %d", c.dim, c.idx, cur))
			}
			if c.idx == cur && floorDiv(at, c.wms) == cur && c.c+a[c.dim] > MaxCounter {
				return Settlement{}, 0, m.corrupt(t, req.Ref, fmt.Errorf("committed %s would pass 2^53-1", c.dim))
			}
		}
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = now
	rec := m.pool.Get().(*record)
	*rec = record{id: req.Ref.ID, state: Settled, digest: digest, leaseExp: now, admitAt: at, resolveAt: math.MaxInt64,
		actual: a, source: SourceOutage, nscopes: len(req.Scopes), heapIdx: -1}
	for i := range req.Scopes {
		sc := &req.Scopes[i]
		s := ss[i]
		if s == nil {
			s = &scopeState{kind: sc.Kind, limits: append([]Limit(nil), sc.Limits...)}
			if sc.Kind == KindGlobal {
				m.glob.scopes[sc.Key] = s
			} else {
				t.scopes[sc.Key] = s
			}
			ss[i] = s
		}
		if sc.Kind == KindGlobal {
			rec.global, t.hasGlobal = true, true
		}
		for _, l := range sc.Limits {
			if l.Dim == Slots {
				continue
			}
			if wms := l.Window.Milliseconds(); s.counter(l.Dim, wms) == nil {
				s.counters = append(s.counters, counter{dim: l.Dim, wms: wms, idx: floorDiv(now, wms), since: t.seq})
			}
		}
		rec.scopes[i] = s
		rec.refs[i] = ScopeRef{Kind: sc.Kind, Key: sc.Key}
		rec.slotMax[i] = -1
	}
	t.charge(rec, &a, now)
	t.records[rec.id] = rec
	t.entomb(rec, now, m.retention)
	m.purge(t, now, inlinePurge)
	st := Settlement{State: Settled, Charged: a}
	for i := range req.Scopes {
		sc, s := &req.Scopes[i], ss[i]
		for _, l := range sc.Limits {
			if l.Dim == Slots {
				continue
			}
			wms := l.Window.Milliseconds()
			if s.committed(l.Dim, wms, now)+s.r[l.Dim] > l.Max {
				st.OverLimit = true
			}
		}
	}
	fillEvent(ev, req.Ref, rec, &a, &a, SourceOutage, Settled, false, now)
	return st, seq, nil
}
