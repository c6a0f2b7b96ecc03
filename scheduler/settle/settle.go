// Package settle is the settlement room: what a call leaves behind it once
// the ledger holds a record of it. It keeps each record's lease alive from
// its Reserve to its terminal transition and fences a call whose lease
// may lapse (lease.go); it owns the one durable pending-writes log, the
// endings the store has not acknowledged and the usage owed from outage
// admissions, retried by one loop (outbox.go, outage.go); and it keeps
// the bodies of completed idempotent responses (idem.go).
//
// The room knows ledger values (refs, amounts, owners, ids), never a call:
// the scheduler's call lifecycle hands it those values and a lease to
// keep. Its collaborators come in through [Deps]: the ledger operations it
// needs, a clock, a logger, the audit trail and the hook that feeds the
// scheduler's ledger error counters. Each part has its own lock; none is
// held across a ledger call.
package settle

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
)

// Ledger is what the settlement room needs from the budget ledger: Extend
// for the leases; Settle, Release and Reserve (the replay of an ambiguous
// keyed Reserve) for the pending endings. A ledger that is also a
// [Charger] charges owed outage usage.
type Ledger interface {
	Reserve(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error)
	Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error)
	Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error)
	Release(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error
}

// Deps are the room's collaborators. Ledger, Owner and LeaseTTL are
// required.
type Deps struct {
	Ledger Ledger
	// Owner is this process's ledger owner: the holder of its leases and
	// of the holds its pending Releases end.
	Owner ledger.Owner
	// LeaseTTL is the ledger.lease_ttl in force; a reload may change it.
	LeaseTTL func() time.Duration
	// Now is the clock. Optional; nil means time.Now.
	Now func() time.Time
	// Log. Optional; nil discards.
	Log *slog.Logger
	// NoteLedger hears the outcome of every ledger call the room makes,
	// by operation (the scheduler's error counters and /readyz).
	// Optional.
	NoteLedger func(op string, err error)
	// Record appends to the audit trail (each owed outage charge once it
	// lands). Optional.
	Record func(audit.Record)
	// Responses shares completed idempotent responses across a fleet.
	// Optional; nil keeps them per instance.
	Responses ResponseStore
	// Retention is how long a completed idempotent response is answered
	// (ledger.tombstone_retention: after it the ledger forgets the id).
	Retention time.Duration
}

// Settler is the settlement room of one process. Build it with [New].
type Settler struct {
	led    Ledger
	owner  ledger.Owner
	ttl    func() time.Duration
	now    func() time.Time
	log    *slog.Logger
	note   func(op string, err error)
	record func(audit.Record)

	leases leases    // lease.go
	outbox outbox    // outbox.go
	outage outages   // outage.go
	idem   idemCache // idem.go

	responses ResponseStore // nil: per instance
	retention time.Duration
}

// New builds the room and opens its pending-writes log at paths.Pending
// ("" keeps it in memory only), taking in what a previous process left
// there and in the files of older versions. writeAhead writes every
// Settle to the log before it is sent: with a networked ledger, whose
// Settle may land after the process died.
func New(d Deps, paths config.StatePaths, writeAhead bool) (*Settler, error) {
	s := &Settler{led: d.Ledger, owner: d.Owner, ttl: d.LeaseTTL, now: d.Now, log: d.Log,
		note: d.NoteLedger, record: d.Record, responses: d.Responses, retention: d.Retention}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.note == nil {
		s.note = func(string, error) {}
	}
	if s.record == nil {
		s.record = func(audit.Record) {}
	}
	s.leases.now = s.now
	s.leases.kick = make(chan struct{}, 1)
	s.outbox.kick = make(chan struct{}, 1)
	owed, err := s.outbox.load(paths, s.log)
	if err != nil {
		return nil, err
	}
	s.outage.restore(owed, &s.outbox)
	s.outbox.ahead = writeAhead
	return s, nil
}

// Loop is the pending-writes log's one retry loop: every second (or when
// kicked) it charges the owed outage usage and retries the pending
// endings, each until the store answers definitely.
func (s *Settler) Loop(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.outbox.kick:
		}
		s.Pass(ctx)
	}
}

// Pass is one pass of the retry loop: the owed outage charges, then the
// pending endings (whose compaction drops the charges' lines). The
// process runs a last one at shutdown.
func (s *Settler) Pass(ctx context.Context) {
	s.ChargeOutages(ctx)
	s.Flush(ctx)
}

// LedgerAnswered is told that the ledger answered after store errors: the
// pending endings and owed charges are retried now, not at the next tick
// (the instance may die meanwhile), and the outage ends. It reports
// whether an outage was in progress.
func (s *Settler) LedgerAnswered() bool {
	s.outbox.kickNow()
	return s.outage.recovered()
}

// LogOwedAtExit says, at shutdown, what is still owed to the ledger and
// where it waits for the next start (or that it is lost, in memory).
func (s *Settler) LogOwedAtExit(pendingPath string) {
	owed := s.outage.count()
	pending := s.outbox.count()
	if owed == 0 && pending == 0 {
		return
	}
	where := pendingPath
	lvl := slog.LevelWarn
	if where == "" {
		where, lvl = "memory only: lost with this process", slog.LevelError
	}
	s.log.Log(context.Background(), lvl, "stopping with usage the ledger has not recorded; what the pending-writes log keeps is charged at the next start",
		"owed_outage_charges", owed, "pending_endings", pending, "pending_file", where)
}

// Unacked is how many endings the store has not acknowledged: pending and
// in flight.
func (s *Settler) Unacked() int { return s.outbox.count() }

// Pending is how many endings wait for the retry loop.
func (s *Settler) Pending() int { return s.outbox.len() }

// Owed is how many outage charges are owed.
func (s *Settler) Owed() int { return s.outage.count() }

// Chargeable is a copy of the owed outage charges whose usage is known:
// what the next pass charges.
func (s *Settler) Chargeable() []OwedCharge { return s.outage.chargeable() }
