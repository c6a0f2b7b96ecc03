package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Fsync selects how the journal is made durable. Every entry is written to
// the file before its call returns, so a process that dies loses nothing it
// acknowledged; fsyncs guard against the machine going down. They are group
// commits: a call that must be durable and finds no fsync in flight starts
// one at once; calls arriving during it wait for the next one, which covers
// them all. No call waits for a timer. A call whose entry, if the machine
// lost it, would leave recovery a state that charges at least as much and
// holds at least as long (docs/LEDGER.md §5, "Which calls wait for the
// fsync") returns once its entry is written, and the entry rides the next
// fsync.
type Fsync struct {
	// Interval bounds how long an entry no call waits for stays written but
	// not fsynced: an fsync is started for it within Interval when no call
	// starts one (counted from the end of an fsync in flight). 0 means 5 ms.
	Interval time.Duration
}

// EveryOp is the default: group commit, lazy entries fsynced within 5 ms.
var EveryOp = Fsync{}

// Group returns an Fsync whose lazy entries are fsynced within interval. It
// differs from EveryOp only in that bound.
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

	// Test hooks: wrapFile wraps the journal's file once open (to count and
	// block fsyncs), afterFunc replaces time.AfterFunc for the lazy-sync
	// timer.
	wrapFile  func(journalFile) journalFile
	afterFunc func(time.Duration, func())
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
	fsync                  prometheus.Observer
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
	fsync := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_ledger_fsync_seconds",
		Help: "Duration of each fsync of the embedded ledger's journal; a dispatch waits for one, so a slow disk delays every tenant's dispatch.",
		// 0.1 ms to 6.5 s: a healthy SSD's fsync is well under a
		// millisecond, a disk shared with a busy neighbour takes hundreds.
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9),
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{alerts, orphans, fsync} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register ledger metrics: %w", err)
			}
		}
	}
	return &memMetrics{corrupt: alerts.WithLabelValues("corrupt"), late: alerts.WithLabelValues("settled_late"), orphans: orphans, fsync: fsync}, nil
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
