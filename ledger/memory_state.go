package ledger

import (
	"context"
	"fmt"
	"sync"
)

// The embedded ledger's per-tenant state: counters, records, lease heaps,
// and the checks and moves every operation shares.

type counter struct {
	dim    Dim
	wms    int64 // window in ms
	idx    int64 // current window index
	c      int64 // committed in window idx
	since  uint64
	purged int64 // audit: charges of purged records counted in c
	adjust int64 // audit: admin adjustments in window idx
}

type scopeState struct {
	kind     Kind
	r        Amounts // in-flight holds (Slots entry unused)
	n        int64   // slots in use
	counters []counter
	limits   []Limit // as last seen by an applied Reserve
}

func (s *scopeState) counter(d Dim, wms int64) *counter {
	for i := range s.counters {
		if s.counters[i].dim == d && s.counters[i].wms == wms {
			return &s.counters[i]
		}
	}
	return nil
}

// committed returns c of (d, W) in the window current at now.
func (s *scopeState) committed(d Dim, wms, now int64) int64 {
	c := s.counter(d, wms)
	if c == nil || c.idx != floorDiv(now, wms) {
		return 0
	}
	return c.c
}

type record struct {
	id       RequestID
	state    State
	owner    Owner
	digest   uint64
	attempt  uint64 // ReserveRequest.Attempt of the Reserve that created it (0: none)
	leaseExp int64  // ms
	admitAt  int64  // ms; admission window of W is floor(admitAt/W)
	// resolveAt is when the first admission window closes (UNRESOLVED → CHARGED).
	resolveAt  int64
	purgeAt    int64
	held       Amounts
	actual     Amounts
	charged    Amounts
	source     Source
	late       bool
	chargedSeq uint64 // 0: never charged
	// jseq is the journal entry that created the record or made it
	// DISPATCHED: a replay of that Reserve or MarkDispatched answers only
	// once the entry is as durable as the original's answer (0: replayed).
	jseq      uint64
	chargedAt int64
	nscopes   int
	scopes    [MaxScopes]*scopeState
	refs      [MaxScopes]ScopeRef
	slotMax   [MaxScopes]int64 // -1: no slots limit in this scope
	slotWarn  [MaxScopes]bool
	heapIdx   int  // index in leases or unres; -1 when in neither
	global    bool // one of scopes is a KindGlobal scope (in Memory.glob)
}

type tenantState struct {
	key ScopeKey

	// mu guards every field below it.
	mu      sync.Mutex
	hwm     int64  // ledger-time high-water mark (ms), raised by every write
	seq     uint64 // applied operations
	pv      uint64 // policy version of the last admitted Reserve (audit only)
	scopes  map[ScopeKey]*scopeState
	records map[RequestID]*record
	leases  leaseHeap // RESERVED and DISPATCHED by leaseExp
	unres   unresHeap // UNRESOLVED by resolveAt
	tombs   []*record // terminal records by purgeAt (FIFO from thead)
	thead   int
	// hasGlobal: some record of this tenant has carried a global hold, so
	// Reclaim must lock the global partition and lockGlobal look records
	// up (sticky).
	hasGlobal bool
}

func (t *tenantState) now(clock int64) int64 {
	if clock > t.hwm {
		return clock
	}
	return t.hwm
}

type leaseHeap []*record

func (h leaseHeap) Len() int { return len(h) }
func (h leaseHeap) Less(i, j int) bool {
	return h[i].leaseExp < h[j].leaseExp
}
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *leaseHeap) Push(x any) {
	r := x.(*record)
	r.heapIdx = len(*h)
	*h = append(*h, r)
}
func (h *leaseHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	r.heapIdx = -1
	return r
}

type unresHeap []*record

func (h unresHeap) Len() int           { return len(h) }
func (h unresHeap) Less(i, j int) bool { return h[i].resolveAt < h[j].resolveAt }
func (h unresHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *unresHeap) Push(x any) {
	r := x.(*record)
	r.heapIdx = len(*h)
	*h = append(*h, r)
}
func (h *unresHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	r.heapIdx = -1
	return r
}

func (m *Memory) tenant(key ScopeKey, create bool) *tenantState {
	m.mu.RLock()
	t := m.tenants[key]
	m.mu.RUnlock()
	if t != nil || !create {
		return t
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if t = m.tenants[key]; t == nil {
		t = &tenantState{key: key, scopes: make(map[ScopeKey]*scopeState), records: make(map[RequestID]*record)}
		m.tenants[key] = t
	}
	return t
}

func (m *Memory) ready(ctx context.Context) error {
	if p := m.failed.Load(); p != nil {
		return fmt.Errorf("journal failed earlier (%w): %w", *p, ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// finish waits for the journal to cover seq (0: nothing journaled).
func (m *Memory) finish(seq uint64) error {
	if seq == 0 || m.jnl == nil {
		return nil
	}
	if err := m.jnl.waitDurable(seq); err != nil {
		m.failed.CompareAndSwap(nil, &err)
		return fmt.Errorf("journal fsync: %w: %w", ErrAmbiguous, err)
	}
	return nil
}

// finishLazy acknowledges a call whose entry need not be fsynced first (its
// loss leaves a state recovery treats at least as conservatively): it checks
// that the entry reached the file and leaves it to the next fsync.
func (m *Memory) finishLazy(seq uint64) error {
	if seq == 0 || m.jnl == nil {
		return nil
	}
	if err := m.jnl.lazy(seq); err != nil {
		m.failed.CompareAndSwap(nil, &err)
		return fmt.Errorf("journal write: %w: %w", ErrAmbiguous, err)
	}
	return nil
}

func (m *Memory) journal(e *entry) uint64 {
	if m.jnl == nil || m.replaying {
		return 0
	}
	return m.jnl.append(e)
}

func (m *Memory) corrupt(t *tenantState, ref Ref, err error) error {
	err = fmt.Errorf("tenant %s: %w: %w", t.key, ErrCorrupt, err)
	if !m.replaying {
		m.met.corrupt.Inc()
		if m.cfg.OnAlert != nil {
			m.cfg.OnAlert(Alert{Reason: "corrupt", Ref: ref, Err: err})
		}
	}
	return err
}

// checkLocked validates a record's state and its scopes' counters before a
// write (I7): refuse, never clamp.
func checkScope(s *scopeState) error {
	if s.n < 0 || s.n > MaxCounter {
		return fmt.Errorf("slots in use %d out of range", s.n)
	}
	for d := range NumDims {
		if !d.Windowed() {
			continue
		}
		if s.r[d] < 0 || s.r[d] > MaxCounter {
			return fmt.Errorf("reserved %s %d out of range", d, s.r[d])
		}
	}
	for i := range s.counters {
		if c := s.counters[i].c; c < 0 || c > MaxCounter {
			return fmt.Errorf("committed %s %d out of range", s.counters[i].dim, c)
		}
	}
	return nil
}

func checkRecord(rec *record) error {
	if rec.state < Reserved || rec.state > SettledLate {
		return fmt.Errorf("record in unknown state %d", rec.state)
	}
	for i := 0; i < rec.nscopes; i++ {
		if err := checkScope(rec.scopes[i]); err != nil {
			return err
		}
	}
	return nil
}

// checkRelease verifies that freeing rec's hold (and slot) keeps counters ≥ 0.
func checkRelease(rec *record, slot bool) error {
	for i := 0; i < rec.nscopes; i++ {
		s := rec.scopes[i]
		for d := range NumDims {
			if !d.Windowed() {
				continue
			}
			if s.r[d] < rec.held[d] {
				return fmt.Errorf("reserved %s %d below hold %d", d, s.r[d], rec.held[d])
			}
		}
		if slot && rec.slotMax[i] >= 0 && s.n < 1 {
			return fmt.Errorf("slots in use %d below 1", s.n)
		}
	}
	return nil
}

func checkCharge(rec *record, a *Amounts) error {
	for i := 0; i < rec.nscopes; i++ {
		for k := range rec.scopes[i].counters {
			c := &rec.scopes[i].counters[k]
			if c.c+a[c.dim] > MaxCounter {
				return fmt.Errorf("committed %s would pass 2^53-1", c.dim)
			}
		}
	}
	return nil
}

func (t *tenantState) releaseHold(rec *record) {
	for i := 0; i < rec.nscopes; i++ {
		s := rec.scopes[i]
		for d := range NumDims {
			if !d.Windowed() {
				continue
			}
			s.r[d] -= rec.held[d]
		}
	}
}

func (t *tenantState) freeSlot(rec *record) {
	for i := 0; i < rec.nscopes; i++ {
		if rec.slotMax[i] >= 0 {
			rec.scopes[i].n--
		}
	}
}

// charge adds a to every counter whose window is rec's admission window and
// still current at now.
func (t *tenantState) charge(rec *record, a *Amounts, now int64) {
	for i := 0; i < rec.nscopes; i++ {
		s := rec.scopes[i]
		for k := range s.counters {
			c := &s.counters[k]
			cur := floorDiv(now, c.wms)
			if floorDiv(rec.admitAt, c.wms) != cur {
				continue
			}
			if c.idx < cur {
				*c = counter{dim: c.dim, wms: c.wms, idx: cur, since: c.since}
			}
			c.c += a[c.dim]
		}
	}
	rec.charged = *a
	rec.chargedSeq = t.seq
	rec.chargedAt = now
}

func (t *tenantState) entomb(rec *record, now, retention int64) {
	rec.purgeAt = now + retention
	t.tombs = append(t.tombs, rec)
}

// purge drops up to max due tombstones; it returns how many.
func (m *Memory) purge(t *tenantState, now int64, limit int) int {
	n := 0
	for n < limit && t.thead < len(t.tombs) && t.tombs[t.thead].purgeAt <= now {
		rec := t.tombs[t.thead]
		t.tombs[t.thead] = nil
		t.thead++
		n++
		if rec.chargedSeq != 0 {
			for i := 0; i < rec.nscopes; i++ {
				if rec.refs[i].Kind == KindGlobal {
					continue // not audited per tenant; the caller may not hold the global lock
				}
				s := rec.scopes[i]
				for k := range s.counters {
					c := &s.counters[k]
					if rec.chargedSeq >= c.since && floorDiv(rec.admitAt, c.wms) == c.idx && floorDiv(rec.chargedAt, c.wms) == c.idx {
						c.purged += rec.charged[c.dim]
					}
				}
			}
		}
		if t.records[rec.id] == rec {
			delete(t.records, rec.id)
		}
		*rec = record{}
		m.pool.Put(rec)
	}
	if t.thead > 64 && t.thead*2 >= len(t.tombs) {
		k := copy(t.tombs, t.tombs[t.thead:])
		clear(t.tombs[k:])
		t.tombs = t.tombs[:k]
		t.thead = 0
	}
	return n
}

const inlinePurge = 2 // tombstones dropped by every write, so memory stays bounded without Run
