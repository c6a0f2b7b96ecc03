package ledger

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Fsync selects how the journal is made durable before a call returns.
type Fsync struct {
	// Interval 0 (EveryOp) syncs before every acknowledgement (concurrent
	// callers still share one fsync); Interval > 0 is a group commit at most
	// every Interval, and each call still waits for the fsync covering it.
	Interval time.Duration
}

// EveryOp fsyncs the journal before every acknowledgement (the default).
var EveryOp = Fsync{}

// Group returns a group-commit Fsync with the given interval.
func Group(interval time.Duration) Fsync { return Fsync{Interval: interval} }

// Alert is reported through MemoryConfig.OnAlert for conditions an operator
// must see: corrupt state and protocol violations.
type Alert struct {
	Reason string // "corrupt", "settled_late" or "journal" (online compaction failed)
	Ref    Ref
	Err    error // for "corrupt"
}

// MemoryConfig configures [NewMemory]. The zero value is a memory-only ledger
// on the real clock with the default lease settings.
type MemoryConfig struct {
	// Clock is the ledger clock. Optional; nil means time.Now. Ledger time is
	// max(Clock, per-tenant high-water mark), in milliseconds.
	Clock func() time.Time
	// Journal is the path of the append-only journal. Optional; "" means
	// memory-only: a restart forgets all committed usage and in-flight holds.
	Journal string
	// Fsync is the journal's durability mode. Optional; default EveryOp.
	Fsync Fsync
	// LeaseTTL is the lease used when ReserveRequest.LeaseTTL is 0.
	// Optional; default 60s.
	LeaseTTL time.Duration
	// MaxLeaseTTL bounds every lease (Reserve and Extend). Optional; default
	// 2·LeaseTTL.
	MaxLeaseTTL time.Duration
	// TombstoneRetention keeps terminal records so late calls see them.
	// Optional; default 1h; must be ≥ 2·MaxLeaseTTL.
	TombstoneRetention time.Duration
	// ReclaimInterval is how often Run reclaims due leases. Optional; default 1s.
	ReclaimInterval time.Duration
	// ReclaimBatch is the max passed to Reclaim by Run. Optional; default 1024.
	ReclaimBatch int
	// CompactBytes makes Run compact the journal (see [Memory.Compact]) once
	// it is larger than this many bytes. Optional; default 64 MiB; negative
	// disables online compaction (the journal is still compacted at start).
	CompactBytes int64
	// OnUsage receives every usage event (Settle, Resolve, automatic charge),
	// after the call's locks are released and after its journal fsync. It must
	// not call back into the ledger synchronously. Optional.
	OnUsage func(UsageEvent)
	// OnOrphan receives a Settle that found no record. Optional.
	OnOrphan func(Ref)
	// OnAlert receives corrupt-state refusals and late settlements. Optional.
	OnAlert func(Alert)
	// Logger receives the start-up notice. Optional; nil means slog.Default().
	Logger *slog.Logger
	// Registerer registers the ledger's metrics. Optional; nil registers none.
	Registerer prometheus.Registerer
}

func (c *MemoryConfig) withDefaults() (MemoryConfig, error) {
	out := *c
	if out.LeaseTTL == 0 {
		out.LeaseTTL = 60 * time.Second
	}
	if out.MaxLeaseTTL == 0 {
		out.MaxLeaseTTL = 2 * out.LeaseTTL
	}
	if out.TombstoneRetention == 0 {
		out.TombstoneRetention = time.Hour
		if m := 2 * out.MaxLeaseTTL; m > out.TombstoneRetention {
			out.TombstoneRetention = m
		}
	}
	if out.ReclaimInterval == 0 {
		out.ReclaimInterval = time.Second
	}
	if out.ReclaimBatch == 0 {
		out.ReclaimBatch = 1024
	}
	if out.CompactBytes == 0 {
		out.CompactBytes = 64 << 20
	}
	var errs []error
	if out.LeaseTTL < time.Millisecond {
		errs = append(errs, fmt.Errorf("ledger.lease_ttl %s must be ≥ 1ms", out.LeaseTTL))
	}
	if out.MaxLeaseTTL < out.LeaseTTL {
		errs = append(errs, fmt.Errorf("ledger.max_lease_ttl %s must be ≥ lease_ttl %s", out.MaxLeaseTTL, out.LeaseTTL))
	}
	if out.TombstoneRetention < 2*out.MaxLeaseTTL {
		errs = append(errs, fmt.Errorf("ledger.tombstone_retention %s must be ≥ 2·max_lease_ttl", out.TombstoneRetention))
	}
	if out.ReclaimInterval < 0 || out.ReclaimBatch < 0 || out.Fsync.Interval < 0 {
		errs = append(errs, errors.New("ledger: negative reclaim interval, reclaim batch or fsync interval"))
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
	}
	return out, nil
}

// Memory is the embedded ledger backend: per-tenant state under its own
// mutex, pooled records, a lease min-heap, an UNRESOLVED min-heap and a
// tombstone FIFO per tenant, and an optional fsynced journal. It is safe for
// concurrent use. Call [Memory.Run] to reclaim due leases and [Memory.Close]
// once when done.
type Memory struct {
	cfg   MemoryConfig
	clock func() time.Time
	jnl   *journal // nil: memory-only
	met   *memMetrics

	// failed holds the first journal failure; after it every call is refused.
	failed atomic.Pointer[error]
	// replaying is true only inside NewMemory's replay (hooks suppressed).
	replaying bool
	// retention is TombstoneRetention in ms (the journaled one during replay).
	retention int64

	pool sync.Pool // *record

	mu      sync.RWMutex // guards tenants
	tenants map[ScopeKey]*tenantState

	// glob is the fleet-wide partition (KindGlobal scopes), shared by every
	// tenant. Lock order: a tenant's mu, then glob.mu (several tenants only
	// in key order, as Compact and Audit do).
	glob globalState
}

// globalState holds the KindGlobal scopes. Records stay in their tenant's
// partition and point at these scope states; every access to them holds mu.
type globalState struct {
	mu     sync.Mutex
	hwm    int64 // ledger-time high-water mark of global writes (ms)
	scopes map[ScopeKey]*scopeState
}

// lockGlobal locks the global partition when the record id of t carries a
// global hold; it returns nil otherwise. The caller holds t.mu.
func (m *Memory) lockGlobal(t *tenantState, id RequestID) *globalState {
	if !t.hasGlobal {
		return nil // no record of t ever held globally: skip the lookup
	}
	if rec := t.records[id]; rec == nil || !rec.global {
		return nil
	}
	m.glob.mu.Lock()
	return &m.glob
}

// lockGlobalReq locks the global partition when req names a global scope or
// its id names a record with a global hold (a replay or conflict reads it).
// The caller holds t.mu.
func (m *Memory) lockGlobalReq(t *tenantState, req *ReserveRequest) *globalState {
	if !req.hasGlobal() {
		return m.lockGlobal(t, req.Ref.ID)
	}
	m.glob.mu.Lock() // lock order: tenant, then global
	return &m.glob
}

// nowLocked is the ledger time of an operation on t (and g when locked):
// global counters need one clock that never goes back, so an operation
// that touches them runs at max(tenant time, global hwm).
func (m *Memory) nowLocked(t *tenantState, g *globalState) int64 {
	now := t.now(m.clock().UnixMilli())
	if g != nil && g.hwm > now {
		now = g.hwm
	}
	return now
}

// unlockGlobal raises the global hwm to now and unlocks g (nil: no-op).
func (m *Memory) unlockGlobal(g *globalState, now int64) {
	if g == nil {
		return
	}
	if now > g.hwm {
		g.hwm = now
	}
	g.mu.Unlock()
}

// scopeOf returns the state of a request scope (nil if never seen): global
// scopes live in the global partition, the others in t.
func (m *Memory) scopeOf(t *tenantState, sc *Scope) *scopeState {
	if sc.Kind == KindGlobal {
		return m.glob.scopes[sc.Key]
	}
	return t.scopes[sc.Key]
}

type memMetrics struct {
	corrupt, late, orphans prometheus.Counter
}

func newMemMetrics(reg prometheus.Registerer) (*memMetrics, error) {
	alerts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_ledger_alerts_total",
		Help: "Ledger conditions an operator must see, by reason (corrupt, settled_late).",
	}, []string{"reason"})
	orphans := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_ledger_orphan_settles_total",
		Help: "Settles that found no reservation record.",
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{alerts, orphans} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register ledger metrics: %w", err)
			}
		}
	}
	return &memMetrics{corrupt: alerts.WithLabelValues("corrupt"), late: alerts.WithLabelValues("settled_late"), orphans: orphans}, nil
}

// NewMemory builds the embedded ledger. With cfg.Journal set it replays the
// journal first: a torn tail is truncated, corruption before it is ErrCorrupt
// (refusing start), DISPATCHED records come back UNRESOLVED and RESERVED ones
// EXPIRED. Without a journal it logs that the ledger is memory-only.
func NewMemory(cfg MemoryConfig) (*Memory, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	met, err := newMemMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Memory{cfg: c, clock: c.Clock, met: met, tenants: make(map[ScopeKey]*tenantState), glob: globalState{scopes: make(map[ScopeKey]*scopeState)},
		retention: c.TombstoneRetention.Milliseconds()}
	if m.clock == nil {
		m.clock = time.Now
	}
	m.pool.New = func() any { return new(record) }
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	if c.Journal == "" {
		log.Warn("ledger: embedded ledger without journal is memory-only; a restart forgets all committed usage and in-flight holds")
		return m, nil
	}
	j, entries, err := openJournal(c.Journal, c.Fsync.Interval)
	if err != nil {
		return nil, err
	}
	m.replaying = true
	for i := range entries {
		if err := m.apply(&entries[i]); err != nil {
			_ = j.close()
			return nil, fmt.Errorf("replay journal %s entry %d (op %d): %w: %w", c.Journal, i, entries[i].op, ErrCorrupt, err)
		}
	}
	m.replaying = false
	// Restart: RESERVED → EXPIRED, DISPATCHED → UNRESOLVED; then compact the
	// journal into this open entry plus a snapshot of the resulting state.
	now := m.clock().UnixMilli()
	e := entry{op: opOpen, time: now, max: c.TombstoneRetention.Milliseconds()}
	if err := m.applyOpen(&e); err != nil {
		_ = j.close()
		return nil, err
	}
	truncated := j.truncated
	if j, err = m.compact(j, c.Journal, &e); err != nil {
		return nil, fmt.Errorf("compact journal %s: %w: %w", c.Journal, ErrUnavailable, err)
	}
	m.jnl = j
	log.Info("ledger: journal replayed and compacted", "path", c.Journal, "entries", len(entries), "truncated_bytes", truncated)
	return m, nil
}

// Close closes the journal. Call it once, after Run has returned.
func (m *Memory) Close() error {
	if m.jnl == nil {
		return nil
	}
	return m.jnl.close()
}

// Run reclaims due leases of every tenant every ReclaimInterval until ctx is
// done, then returns nil. A Reclaim error (corrupt tenant) is reported via
// OnAlert and does not stop Run.
func (m *Memory) Run(ctx context.Context) error {
	tick := time.NewTicker(m.cfg.ReclaimInterval)
	defer tick.Stop()
	var keys []ScopeKey
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		keys = keys[:0]
		m.mu.RLock()
		for k := range m.tenants {
			keys = append(keys, k)
		}
		m.mu.RUnlock()
		for _, k := range keys {
			for {
				st, err := m.Reclaim(ctx, k, m.cfg.ReclaimBatch)
				if err != nil || !st.More || ctx.Err() != nil {
					break
				}
			}
		}
		if m.jnl != nil && m.cfg.CompactBytes > 0 && m.jnl.sizeNow() > m.cfg.CompactBytes {
			if err := m.Compact(ctx); err != nil && m.cfg.OnAlert != nil {
				m.cfg.OnAlert(Alert{Reason: "journal", Err: err})
			}
		}
	}
}

// ---- per-tenant state ----

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
	chargedAt  int64
	nscopes    int
	scopes     [MaxScopes]*scopeState
	refs       [MaxScopes]ScopeRef
	slotMax    [MaxScopes]int64 // -1: no slots limit in this scope
	slotWarn   [MaxScopes]bool
	heapIdx    int  // index in leases or unres; -1 when in neither
	global     bool // one of scopes is a KindGlobal scope (in Memory.glob)
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

// ---- operations ----

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
	if err := m.finish(seq); err != nil {
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
		return g, 0, nil
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
		resolveAt: math.MaxInt64, held: req.Held, nscopes: len(req.Scopes), heapIdx: -1}
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
		return 0, nil
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
	rec.state = Dispatched
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
	if err := m.finish(seq); err != nil {
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
	if ferr := m.finish(seq); ferr != nil {
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
	return m.finish(seq)
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

// Reclaim implements [Ledger.Reclaim]: at most max transitions (max ≤ 0
// means 1024) of due leases (RESERVED → EXPIRED, DISPATCHED → UNRESOLVED),
// UNRESOLVED records whose first admission window has closed (→ CHARGED),
// and tombstones past TombstoneRetention. It never acts early.
func (m *Memory) Reclaim(ctx context.Context, tenant ScopeKey, limit int) (ReclaimStats, error) {
	if err := m.ready(ctx); err != nil {
		return ReclaimStats{}, err
	}
	if limit <= 0 {
		limit = 1024
	}
	t := m.tenant(tenant, false)
	if t == nil {
		return ReclaimStats{}, nil
	}
	t.mu.Lock()
	var gl *globalState
	if t.hasGlobal {
		gl = &m.glob
		gl.mu.Lock()
	}
	e := entry{op: opReclaim, ref: Ref{Tenant: tenant}, max: int64(limit), time: m.nowLocked(t, gl)}
	var evs []UsageEvent
	st, seq, err := m.reclaimLocked(t, &e, &evs)
	m.unlockGlobal(gl, e.time)
	t.mu.Unlock()
	if err != nil {
		return ReclaimStats{}, err
	}
	if err := m.finish(seq); err != nil {
		return ReclaimStats{}, err
	}
	if m.cfg.OnUsage != nil {
		for i := range evs {
			m.cfg.OnUsage(evs[i])
		}
	}
	return st, nil
}

func (m *Memory) reclaimLocked(t *tenantState, e *entry, evs *[]UsageEvent) (ReclaimStats, uint64, error) {
	now, limit := e.time, int(e.max)
	if (len(t.leases) == 0 || t.leases[0].leaseExp > now) && (len(t.unres) == 0 || t.unres[0].resolveAt > now) &&
		(t.thead >= len(t.tombs) || t.tombs[t.thead].purgeAt > now) {
		return ReclaimStats{}, 0, nil // nothing due: O(1)
	}
	// Validate everything this call would touch before the first write (I7).
	due := 0
	for _, rec := range t.leases {
		if rec.leaseExp <= now {
			due++
			if err := m.reclaimCheck(t, rec); err != nil {
				return ReclaimStats{}, 0, m.corrupt(t, Ref{Tenant: t.key, ID: rec.id}, err)
			}
		}
	}
	for _, rec := range t.unres {
		if rec.resolveAt <= now {
			due++
			if err := m.reclaimCheck(t, rec); err != nil {
				return ReclaimStats{}, 0, m.corrupt(t, Ref{Tenant: t.key, ID: rec.id}, err)
			}
		}
	}
	if t.thead < len(t.tombs) && t.tombs[t.thead].purgeAt <= now {
		due++
	}
	if due == 0 {
		return ReclaimStats{}, 0, nil
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = now
	var st ReclaimStats
	retention := m.retention
	for len(t.leases) > 0 && t.leases[0].leaseExp <= now {
		if st.Expired+st.Unresolved >= limit {
			st.More = true
			break
		}
		rec := heap.Pop(&t.leases).(*record)
		if rec.state == Reserved {
			t.releaseHold(rec)
			rec.state = Expired
			t.entomb(rec, now, retention)
			st.Expired++
			continue
		}
		t.freeSlot(rec)
		rec.state = Unresolved
		heap.Push(&t.unres, rec)
		st.Unresolved++
	}
	for len(t.unres) > 0 && t.unres[0].resolveAt <= now {
		if st.Expired+st.Unresolved+st.Charged >= limit {
			st.More = true
			break
		}
		var ev UsageEvent
		m.chargeHeld(t, t.unres[0], now, &ev)
		if !m.replaying {
			*evs = append(*evs, ev)
		}
		st.Charged++
	}
	if left := limit - st.Expired - st.Unresolved - st.Charged; left > 0 {
		st.Purged = m.purge(t, now, left)
	}
	if t.thead < len(t.tombs) && t.tombs[t.thead].purgeAt <= now {
		st.More = true
	}
	return st, seq, nil
}

func (m *Memory) reclaimCheck(t *tenantState, rec *record) error {
	if t.records[rec.id] != rec {
		return errors.New("lease entry without record")
	}
	if err := checkRecord(rec); err != nil {
		return err
	}
	switch rec.state {
	case Reserved:
		return checkRelease(rec, false)
	case Dispatched:
		return checkRelease(rec, true)
	case Unresolved:
		return m.chargeHeldCheck(t, rec)
	}
	return fmt.Errorf("record in state %s on a heap", rec.state)
}

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
