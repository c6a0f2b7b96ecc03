package ledger

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// The embedded ledger's writing operations, each journaled before it is
// acknowledged.

// Reserve implements [Ledger.Reserve].
func (m *Memory) Reserve(ctx context.Context, req ReserveRequest) (Grant, error) {
	if err := m.ready(ctx); err != nil {
		return Grant{}, err
	}
	if err := req.Validate(m.cfg.MaxLeaseTTL); err != nil {
		return Grant{}, err
	}
	ttl := req.LeaseTTL
	if ttl == 0 {
		ttl = m.cfg.LeaseTTL
	}
	t := m.tenant(req.Ref.Tenant, true)
	e := entry{op: opReserve, ref: req.Ref, req: &req, ttl: ttl.Milliseconds()}
	t.mu.Lock()
	gl := m.lockGlobalReq(t, &req)
	e.time = m.nowLocked(t, gl)
	g, seq, err := m.reserveLocked(t, &e)
	m.unlockGlobal(gl, e.time)
	t.mu.Unlock()
	if err != nil {
		return Grant{}, err
	}
	// A RESERVED record lost with the machine is what recovery makes of one
	// anyway (EXPIRED: nothing ran, nothing charged), and the MarkDispatched
	// that must precede the first upstream byte waits for an fsync, which
	// covers this entry too (the journal is one ordered file). A Reserve that
	// dispatches waits itself.
	if req.Dispatch {
		err = m.finish(seq)
	} else {
		err = m.finishLazy(seq)
	}
	if err != nil {
		return Grant{}, err
	}
	return g, nil
}

func (m *Memory) reserveLocked(t *tenantState, e *entry) (Grant, uint64, error) {
	req, now := e.req, e.time
	if rec := t.records[req.Ref.ID]; rec != nil {
		if err := checkRecord(rec); err != nil {
			return Grant{}, 0, m.corrupt(t, req.Ref, err)
		}
		if !rec.state.Open() {
			return Grant{}, 0, &FinalError{State: rec.state}
		}
		if rec.digest != req.Digest() {
			return Grant{}, 0, fmt.Errorf("reserve %s: different payload: %w", req.Ref.ID, ErrConflict)
		}
		// The same attempt again is the caller's own retry after a lost
		// reply: it gets its grant back as a success.
		sameAttempt := req.Attempt != 0 && rec.attempt == req.Attempt
		g := Grant{Ref: req.Ref, Owner: rec.owner, State: rec.state, LeaseExpiry: time.UnixMilli(rec.leaseExp).UTC(), Replayed: !sameAttempt}
		m.headroom(t, req, now, &g)
		return g, rec.jseq, nil
	}
	// Admission (no writes yet). Existing scope states only; a new scope has
	// zero counters.
	var denied *DeniedError
	var slotDenied *DeniedError
	var ss [MaxScopes]*scopeState // looked up once
	for i := range req.Scopes {
		sc := &req.Scopes[i]
		s := m.scopeOf(t, sc)
		ss[i] = s
		if s != nil {
			if err := checkScope(s); err != nil {
				return Grant{}, 0, m.corrupt(t, req.Ref, err)
			}
		}
		for _, l := range sc.Limits {
			if l.Mode != Block {
				continue
			}
			if l.Dim == Slots {
				if !req.Dispatch {
					continue
				}
				var n int64
				if s != nil {
					n = s.n
				}
				if n+1 > l.Max && slotDenied == nil {
					slotDenied = &DeniedError{Scope: sc.Kind, Dim: Slots, Limit: l.Max, Reserved: n, Requested: 1}
				}
				continue
			}
			wms := l.Window.Milliseconds()
			var c, r int64
			if s != nil {
				c, r = s.committed(l.Dim, wms, now), s.r[l.Dim]
			}
			h := req.Held[l.Dim]
			if c+r+h <= l.Max {
				continue
			}
			resets := WindowResetsAt(floorDiv(now, wms), l.Window)
			if denied == nil || resets.After(denied.ResetsAt) {
				denied = &DeniedError{Scope: sc.Kind, Dim: l.Dim, Window: l.Window, Limit: l.Max, Committed: c,
					Reserved: r, Requested: h, ResetsAt: resets, RetryAfter: resets.Sub(time.UnixMilli(now))}
			}
		}
	}
	if denied != nil {
		return Grant{}, 0, denied
	}
	if slotDenied != nil {
		return Grant{}, 0, slotDenied
	}
	for i := range req.Scopes {
		if s := ss[i]; s != nil {
			for d := range NumDims {
				if !d.Windowed() {
					continue
				}
				if s.r[d]+req.Held[d] > MaxCounter {
					return Grant{}, 0, m.corrupt(t, req.Ref, fmt.Errorf("reserved %s would pass 2^53-1", d))
				}
			}
		}
	}
	seq := m.journal(e)
	// Apply.
	t.seq++
	t.hwm = now
	t.pv = req.PolicyVersion // recorded for audit, never compared (see doc.go)
	rec := m.pool.Get().(*record)
	*rec = record{id: req.Ref.ID, owner: req.Owner, digest: req.Digest(), attempt: req.Attempt, leaseExp: now + e.ttl, admitAt: now,
		resolveAt: math.MaxInt64, held: req.Held, nscopes: len(req.Scopes), heapIdx: -1, jseq: seq}
	rec.held[Slots] = 0
	for i := range req.Scopes {
		sc := &req.Scopes[i]
		s := ss[i]
		if s == nil {
			s = &scopeState{kind: sc.Kind}
			if sc.Kind == KindGlobal {
				m.glob.scopes[sc.Key] = s
				rec.global, t.hasGlobal = true, true
			} else {
				t.scopes[sc.Key] = s
			}
			ss[i] = s
		} else if sc.Kind == KindGlobal {
			rec.global, t.hasGlobal = true, true
		}
		if !limitsEqual(s.limits, sc.Limits) {
			s.limits = append(s.limits[:0:0], sc.Limits...)
		}
		rec.scopes[i] = s
		rec.refs[i] = ScopeRef{Kind: sc.Kind, Key: sc.Key}
		rec.slotMax[i] = -1
		for _, l := range sc.Limits {
			if l.Dim == Slots {
				rec.slotMax[i], rec.slotWarn[i] = l.Max, l.Mode == Warn
				continue
			}
			wms := l.Window.Milliseconds()
			if s.counter(l.Dim, wms) == nil {
				s.counters = append(s.counters, counter{dim: l.Dim, wms: wms, idx: floorDiv(now, wms), since: t.seq})
			}
			if end := (floorDiv(now, wms) + 1) * wms; end < rec.resolveAt {
				rec.resolveAt = end
			}
		}
		for d := range NumDims {
			if !d.Windowed() {
				continue
			}
			s.r[d] += rec.held[d]
		}
	}
	rec.state = Reserved
	if req.Dispatch {
		rec.state = Dispatched
		for i := 0; i < rec.nscopes; i++ {
			if rec.slotMax[i] >= 0 {
				rec.scopes[i].n++
			}
		}
	}
	t.records[rec.id] = rec
	heap.Push(&t.leases, rec)
	m.purge(t, now, inlinePurge)
	g := Grant{Ref: req.Ref, Owner: rec.owner, State: rec.state, LeaseExpiry: time.UnixMilli(rec.leaseExp).UTC()}
	m.headroomOf(&ss, req, now, &g)
	return g, seq, nil
}

func limitsEqual(a, b []Limit) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// headroom fills g.Headroom and g.Warnings from the current counters.
func (m *Memory) headroom(t *tenantState, req *ReserveRequest, now int64, g *Grant) {
	var ss [MaxScopes]*scopeState
	for i := range req.Scopes {
		ss[i] = m.scopeOf(t, &req.Scopes[i])
	}
	m.headroomOf(&ss, req, now, g)
}

// headroomOf is headroom with the request's scope states already looked up.
func (m *Memory) headroomOf(ss *[MaxScopes]*scopeState, req *ReserveRequest, now int64, g *Grant) {
	for i := range req.Scopes {
		sc := &req.Scopes[i]
		s := ss[i]
		for _, l := range sc.Limits {
			var used int64
			var resets time.Time
			if l.Dim == Slots {
				if s != nil {
					used = s.n
				}
			} else {
				wms := l.Window.Milliseconds()
				if s != nil {
					used = s.committed(l.Dim, wms, now) + s.r[l.Dim]
				}
				resets = WindowResetsAt(floorDiv(now, wms), l.Window)
			}
			if l.Mode == Warn {
				if used > l.Max {
					g.Warnings = append(g.Warnings, Warning{Scope: sc.Kind, Dim: l.Dim, Window: l.Window, Limit: l.Max, Used: used, ResetsAt: resets})
				}
				continue
			}
			rem := max(l.Max-used, 0)
			room := &g.Headroom[l.Dim]
			if !room.Tracked || rem < room.Remaining || (rem == room.Remaining && resets.After(room.ResetsAt)) {
				*room = Room{Tracked: true, Limit: l.Max, Remaining: rem, Window: l.Window, ResetsAt: resets}
			}
		}
	}
}

// lookup returns the tenant and locks it, or an error when the record cannot exist.
func (m *Memory) lockTenant(ref Ref) *tenantState {
	t := m.tenant(ref.Tenant, true)
	t.mu.Lock()
	return t
}

// MarkDispatched implements [Ledger.MarkDispatched]. On a full slot limit it
// returns a *DeniedError on Slots and leaves the record RESERVED. A replay
// for an already DISPATCHED record of the same owner returns nil.
func (m *Memory) MarkDispatched(ctx context.Context, ref Ref, owner Owner) error {
	if err := m.ready(ctx); err != nil {
		return err
	}
	t := m.lockTenant(ref)
	g := m.lockGlobal(t, ref.ID)
	e := entry{op: opMark, ref: ref, owner: owner, time: m.nowLocked(t, g)}
	seq, err := m.markLocked(t, &e)
	m.unlockGlobal(g, e.time)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	// Waits: a record lost with the machine after its request went upstream
	// would come back RESERVED and expire uncharged.
	return m.finish(seq)
}

func (m *Memory) markLocked(t *tenantState, e *entry) (uint64, error) {
	rec := t.records[e.ref.ID]
	if rec == nil {
		return 0, fmt.Errorf("dispatch %s: %w", e.ref.ID, ErrNotFound)
	}
	if err := checkRecord(rec); err != nil {
		return 0, m.corrupt(t, e.ref, err)
	}
	switch rec.state {
	case Reserved:
	case Dispatched:
		if rec.owner != e.owner {
			return 0, fmt.Errorf("dispatch %s: another owner: %w", e.ref.ID, ErrLeaseLost)
		}
		return rec.jseq, nil
	case Expired, Unresolved:
		return 0, fmt.Errorf("dispatch %s: state %s: %w", e.ref.ID, rec.state, ErrLeaseLost)
	default:
		return 0, fmt.Errorf("dispatch %s: state %s: %w", e.ref.ID, rec.state, ErrAlreadyFinal)
	}
	if rec.owner != e.owner {
		return 0, fmt.Errorf("dispatch %s: another owner: %w", e.ref.ID, ErrLeaseLost)
	}
	for i := 0; i < rec.nscopes; i++ {
		s := rec.scopes[i]
		if rec.slotMax[i] >= 0 && !rec.slotWarn[i] && s.n+1 > rec.slotMax[i] {
			return 0, &DeniedError{Scope: rec.refs[i].Kind, Dim: Slots, Limit: rec.slotMax[i], Reserved: s.n, Requested: 1}
		}
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = e.time
	rec.state, rec.jseq = Dispatched, seq
	for i := 0; i < rec.nscopes; i++ {
		if rec.slotMax[i] >= 0 {
			rec.scopes[i].n++
		}
	}
	m.purge(t, e.time, inlinePurge)
	return seq, nil
}

// Extend implements [Ledger.Extend]: the lease becomes now + ttl.
func (m *Memory) Extend(ctx context.Context, ref Ref, owner Owner, ttl time.Duration) (time.Time, error) {
	if err := m.ready(ctx); err != nil {
		return time.Time{}, err
	}
	if ttl < time.Millisecond || ttl > m.cfg.MaxLeaseTTL {
		return time.Time{}, fmt.Errorf("extend ttl %s outside 1ms..%s: %w", ttl, m.cfg.MaxLeaseTTL, ErrInvalid)
	}
	t := m.lockTenant(ref)
	g := m.lockGlobal(t, ref.ID)
	e := entry{op: opExtend, ref: ref, owner: owner, ttl: ttl.Milliseconds(), time: m.nowLocked(t, g)}
	exp, seq, err := m.extendLocked(t, &e)
	m.unlockGlobal(g, e.time)
	t.mu.Unlock()
	if err != nil {
		return time.Time{}, err
	}
	// Recovery ends every open record whatever its lease (opOpen), so a
	// lost Extend changes nothing it does.
	if err := m.finishLazy(seq); err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(exp).UTC(), nil
}

func (m *Memory) extendLocked(t *tenantState, e *entry) (int64, uint64, error) {
	rec := t.records[e.ref.ID]
	if rec == nil {
		return 0, 0, fmt.Errorf("extend %s: %w", e.ref.ID, ErrNotFound)
	}
	if err := checkRecord(rec); err != nil {
		return 0, 0, m.corrupt(t, e.ref, err)
	}
	switch rec.state {
	case Reserved, Dispatched:
		if rec.owner != e.owner {
			return 0, 0, fmt.Errorf("extend %s: another owner: %w", e.ref.ID, ErrLeaseLost)
		}
	case Expired, Unresolved:
		return 0, 0, fmt.Errorf("extend %s: state %s: %w", e.ref.ID, rec.state, ErrLeaseLost)
	default:
		return 0, 0, fmt.Errorf("extend %s: state %s: %w", e.ref.ID, rec.state, ErrAlreadyFinal)
	}
	if rec.heapIdx < 0 || rec.heapIdx >= len(t.leases) || t.leases[rec.heapIdx] != rec {
		return 0, 0, m.corrupt(t, e.ref, errors.New("open record missing from the lease heap"))
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = e.time
	rec.leaseExp = e.time + e.ttl
	heap.Fix(&t.leases, rec.heapIdx)
	m.purge(t, e.time, inlinePurge)
	return rec.leaseExp, seq, nil
}

// Settle implements [Ledger.Settle]. The first Settle wins; the same actual
// again is Replayed, a different one ErrConflict. Settling a RESERVED record
// (never dispatched) releases its hold and charges the actual.
func (m *Memory) Settle(ctx context.Context, ref Ref, actual Amounts, src Source) (Settlement, error) {
	if err := m.ready(ctx); err != nil {
		return Settlement{}, err
	}
	if err := actual.Validate(); err != nil {
		return Settlement{}, err
	}
	if !src.Valid() {
		return Settlement{}, fmt.Errorf("source %d: %w", src, ErrInvalid)
	}
	actual[Slots] = 0
	t := m.lockTenant(ref)
	g := m.lockGlobal(t, ref.ID)
	e := entry{op: opSettle, ref: ref, actual: actual, src: src, time: m.nowLocked(t, g)}
	var ev UsageEvent
	st, seq, emit, err := m.settleLocked(t, &e, &ev)
	m.unlockGlobal(g, e.time)
	t.mu.Unlock()
	if errors.Is(err, ErrNotFound) {
		m.met.orphans.Inc()
		if m.cfg.OnOrphan != nil {
			m.cfg.OnOrphan(ref)
		}
	}
	// A usage event is a billing record: it never precedes its entry's fsync.
	finish := m.finish
	if e.lazy && !(emit && m.cfg.OnUsage != nil) {
		finish = m.finishLazy
	}
	if ferr := finish(seq); ferr != nil {
		return Settlement{}, ferr
	}
	if emit {
		if st.State == SettledLate {
			m.met.late.Inc()
			if m.cfg.OnAlert != nil {
				m.cfg.OnAlert(Alert{Reason: "settled_late", Ref: ref})
			}
		}
		if m.cfg.OnUsage != nil {
			m.cfg.OnUsage(ev)
		}
	}
	return st, err
}

func fillEvent(ev *UsageEvent, ref Ref, rec *record, actual, charged *Amounts, src Source, state State, late bool, now int64) {
	*ev = UsageEvent{Ref: ref, NScopes: rec.nscopes, Held: rec.held, Actual: *actual, Charged: *charged, Source: src,
		State: state, Late: late, AdmittedAt: time.UnixMilli(rec.admitAt).UTC(), At: time.UnixMilli(now).UTC()}
	copy(ev.Scopes[:], rec.refs[:rec.nscopes])
}

func overrun(a, h *Amounts) Amounts {
	var o Amounts
	for d := range NumDims {
		if !d.Windowed() {
			continue
		}
		if a[d] > h[d] {
			o[d] = a[d] - h[d]
		}
	}
	return o
}

func (m *Memory) settleLocked(t *tenantState, e *entry, ev *UsageEvent) (Settlement, uint64, bool, error) {
	rec := t.records[e.ref.ID]
	if rec == nil {
		return Settlement{}, 0, false, fmt.Errorf("settle %s: %w", e.ref.ID, ErrNotFound)
	}
	if err := checkRecord(rec); err != nil {
		return Settlement{}, 0, false, m.corrupt(t, e.ref, err)
	}
	now := e.time
	switch rec.state {
	case Settled, SettledLate:
		if rec.actual != e.actual {
			return Settlement{}, 0, false, fmt.Errorf("settle %s: different actual: %w", e.ref.ID, ErrConflict)
		}
		return Settlement{State: rec.state, Charged: rec.charged, Overrun: overrun(&rec.charged, &rec.held), Late: rec.late, Replayed: true}, 0, false, nil
	case Charged:
		var zero Amounts
		fillEvent(ev, e.ref, rec, &e.actual, &zero, e.src, Charged, true, now)
		return Settlement{}, 0, true, fmt.Errorf("settle %s: already charged at its hold: %w", e.ref.ID, ErrAlreadyFinal)
	case Released, Expired:
		if err := checkCharge(rec, &e.actual); err != nil {
			return Settlement{}, 0, false, m.corrupt(t, e.ref, err)
		}
		seq := m.journal(e)
		t.seq++
		t.hwm = now
		t.charge(rec, &e.actual, now)
		rec.state, rec.actual, rec.source, rec.late = SettledLate, e.actual, e.src, true
		m.purge(t, now, inlinePurge)
		fillEvent(ev, e.ref, rec, &e.actual, &e.actual, e.src, SettledLate, true, now)
		return Settlement{State: SettledLate, Charged: e.actual, Overrun: overrun(&e.actual, &rec.held), Late: true}, seq, true, nil
	}
	// Reserved, Dispatched, Unresolved.
	prev := rec.state
	if err := checkRelease(rec, prev == Dispatched); err != nil {
		return Settlement{}, 0, false, m.corrupt(t, e.ref, err)
	}
	if err := checkCharge(rec, &e.actual); err != nil {
		return Settlement{}, 0, false, m.corrupt(t, e.ref, err)
	}
	if err := t.checkHeap(rec); err != nil {
		return Settlement{}, 0, false, m.corrupt(t, e.ref, err)
	}
	// Lost with the machine, this Settle leaves a DISPATCHED or UNRESOLVED
	// record, which recovery keeps UNRESOLVED and charges at its hold: never
	// less than an actual within the hold. An overrun, or a charge on a
	// record recovery would expire uncharged, waits for its fsync.
	e.lazy = prev != Reserved && overrun(&e.actual, &rec.held) == Amounts{} || e.actual == Amounts{}
	seq := m.journal(e)
	t.seq++
	t.hwm = now
	t.unlink(rec)
	t.releaseHold(rec)
	if prev == Dispatched {
		t.freeSlot(rec)
	}
	t.charge(rec, &e.actual, now)
	rec.state, rec.actual, rec.source, rec.late = Settled, e.actual, e.src, prev == Unresolved
	t.entomb(rec, now, m.retention)
	m.purge(t, now, inlinePurge)
	fillEvent(ev, e.ref, rec, &e.actual, &e.actual, e.src, Settled, rec.late, now)
	return Settlement{State: Settled, Charged: e.actual, Overrun: overrun(&e.actual, &rec.held), Late: rec.late}, seq, true, nil
}

// checkHeap verifies an open record sits in the heap its state implies.
func (t *tenantState) checkHeap(rec *record) error {
	i := rec.heapIdx
	switch rec.state {
	case Reserved, Dispatched:
		if i >= 0 && i < len(t.leases) && t.leases[i] == rec {
			return nil
		}
		return errors.New("open record missing from the lease heap")
	case Unresolved:
		if i >= 0 && i < len(t.unres) && t.unres[i] == rec {
			return nil
		}
		return errors.New("unresolved record missing from its heap")
	}
	return nil
}

// unlink removes an open record from its heap.
func (t *tenantState) unlink(rec *record) {
	switch rec.state {
	case Reserved, Dispatched:
		heap.Remove(&t.leases, rec.heapIdx)
	case Unresolved:
		heap.Remove(&t.unres, rec.heapIdx)
	}
}

// Release implements [Ledger.Release]. Before dispatch it frees the hold; on
// an unknown id it writes a RELEASED tombstone so a late Reserve gets
// ErrAlreadyFinal; after dispatch it is ErrDispatched. Releasing a RELEASED,
// EXPIRED or SETTLED_LATE record again returns nil.
func (m *Memory) Release(ctx context.Context, ref Ref, owner Owner) error {
	if err := m.ready(ctx); err != nil {
		return err
	}
	if ref.ID.IsZero() {
		return fmt.Errorf("zero request id: %w", ErrInvalid)
	}
	t := m.lockTenant(ref)
	g := m.lockGlobal(t, ref.ID)
	e := entry{op: opRelease, ref: ref, owner: owner, time: m.nowLocked(t, g)}
	seq, err := m.releaseLocked(t, &e)
	m.unlockGlobal(g, e.time)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	// A lost Release leaves the record RESERVED (or absent), which recovery
	// makes EXPIRED: the same hold freed, nothing charged.
	return m.finishLazy(seq)
}

func (m *Memory) releaseLocked(t *tenantState, e *entry) (uint64, error) {
	now := e.time
	rec := t.records[e.ref.ID]
	if rec == nil {
		seq := m.journal(e)
		t.seq++
		t.hwm = now
		rec = m.pool.Get().(*record)
		*rec = record{id: e.ref.ID, owner: e.owner, state: Released, admitAt: now, resolveAt: math.MaxInt64, heapIdx: -1}
		t.records[rec.id] = rec
		t.entomb(rec, now, m.retention)
		m.purge(t, now, inlinePurge)
		return seq, nil
	}
	if err := checkRecord(rec); err != nil {
		return 0, m.corrupt(t, e.ref, err)
	}
	switch rec.state {
	case Released, Expired, SettledLate:
		return 0, nil
	case Reserved:
	default:
		return 0, fmt.Errorf("release %s: state %s: %w", e.ref.ID, rec.state, ErrDispatched)
	}
	if rec.owner != e.owner {
		return 0, fmt.Errorf("release %s: another owner: %w", e.ref.ID, ErrLeaseLost)
	}
	if err := checkRelease(rec, false); err != nil {
		return 0, m.corrupt(t, e.ref, err)
	}
	if err := t.checkHeap(rec); err != nil {
		return 0, m.corrupt(t, e.ref, err)
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = now
	t.unlink(rec)
	t.releaseHold(rec)
	rec.state = Released
	t.entomb(rec, now, m.retention)
	m.purge(t, now, inlinePurge)
	return seq, nil
}

// Resolve implements [Ledger.Resolve]: an admin charges one UNRESOLVED hold at
// its held amount (CHARGED). A replay on a CHARGED record is Replayed.
func (m *Memory) Resolve(ctx context.Context, ref Ref) (Settlement, error) {
	if err := m.ready(ctx); err != nil {
		return Settlement{}, err
	}
	t := m.lockTenant(ref)
	g := m.lockGlobal(t, ref.ID)
	e := entry{op: opResolve, ref: ref, time: m.nowLocked(t, g)}
	var ev UsageEvent
	st, seq, err := m.resolveLocked(t, &e, &ev)
	m.unlockGlobal(g, e.time)
	t.mu.Unlock()
	return m.acknowledge(st, seq, err, &ev)
}

// acknowledge finishes an applied Resolve or Charge (locks released): it
// waits for the journal entry seq, then emits the usage event unless the
// call was a replay.
func (m *Memory) acknowledge(st Settlement, seq uint64, err error, ev *UsageEvent) (Settlement, error) {
	if err != nil {
		return Settlement{}, err
	}
	if err := m.finish(seq); err != nil {
		return Settlement{}, err
	}
	if !st.Replayed && m.cfg.OnUsage != nil {
		m.cfg.OnUsage(*ev)
	}
	return st, nil
}

func (m *Memory) resolveLocked(t *tenantState, e *entry, ev *UsageEvent) (Settlement, uint64, error) {
	rec := t.records[e.ref.ID]
	if rec == nil {
		return Settlement{}, 0, fmt.Errorf("resolve %s: %w", e.ref.ID, ErrNotFound)
	}
	if err := checkRecord(rec); err != nil {
		return Settlement{}, 0, m.corrupt(t, e.ref, err)
	}
	switch rec.state {
	case Unresolved:
	case Charged:
		return Settlement{State: Charged, Charged: rec.charged, Late: true, Replayed: true}, 0, nil
	case Reserved, Dispatched:
		return Settlement{}, 0, fmt.Errorf("resolve %s: state %s is not unresolved: %w", e.ref.ID, rec.state, ErrConflict)
	default:
		return Settlement{}, 0, fmt.Errorf("resolve %s: state %s: %w", e.ref.ID, rec.state, ErrAlreadyFinal)
	}
	if err := m.chargeHeldCheck(t, rec); err != nil {
		return Settlement{}, 0, m.corrupt(t, e.ref, err)
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = e.time
	m.chargeHeld(t, rec, e.time, ev)
	return Settlement{State: Charged, Charged: rec.charged, Late: true}, seq, nil
}

func (m *Memory) chargeHeldCheck(t *tenantState, rec *record) error {
	if err := checkRelease(rec, false); err != nil {
		return err
	}
	if err := checkCharge(rec, &rec.held); err != nil {
		return err
	}
	return t.checkHeap(rec)
}

// chargeHeld moves an UNRESOLVED record to CHARGED at its hold.
func (m *Memory) chargeHeld(t *tenantState, rec *record, now int64, ev *UsageEvent) {
	t.unlink(rec)
	t.releaseHold(rec)
	t.charge(rec, &rec.held, now)
	rec.state, rec.actual, rec.source, rec.late = Charged, rec.held, SourceResolved, true
	t.entomb(rec, now, m.retention)
	fillEvent(ev, Ref{Tenant: t.key, ID: rec.id}, rec, &rec.held, &rec.held, SourceResolved, Charged, true, now)
}
