package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/abuse"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/settle"
	"github.com/sluicehq/sluice/scheduler/statestore"
	"github.com/sluicehq/sluice/scheduler/views"
)

// Ledger is what the scheduler needs from a budget ledger (both
// ledger.Memory and the Redis backend provide it): what a call needs, the
// settlement room's lease extensions, and the admin API's resolutions.
type Ledger interface {
	lifecycle.Ledger
	Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error)
	Resolve(ctx context.Context, ref ledger.Ref) (ledger.Settlement, error)
}

// Deps are the scheduler's collaborators. Ledger and Upstream are required.
type Deps struct {
	Ledger   Ledger
	Upstream lifecycle.Upstream
	// Keyer hashes tenant, key and workflow ids for the ledger. Required.
	Keyer *ledger.Keyer
	// GPU sizes replicas and keeps their GPU-ms clocks (gpu.Monitor).
	// Required.
	GPU GPU
	// Attribution records per-tenant GPU-ms. Optional.
	Attribution *gpu.AttributionMetrics
	// Registerer receives the metrics. Optional; nil means a private registry.
	Registerer prometheus.Registerer
	// Audit receives every admission decision, settlement and admin change.
	// Optional; nil keeps no trail.
	Audit Auditor
	// Tracer records one trace per admitted request (trace.go). Optional;
	// nil traces nothing.
	Tracer trace.Tracer
	// Logger. Optional; nil discards.
	Logger *slog.Logger
	// Now is the clock. Optional; nil means time.Now.
	Now func() time.Time
	// State is the fleet-shared store of the admin state (budgets and
	// clamps set through the admin API): Redis in the Redis layout, files
	// next to the journal in the embedded one. Optional; nil keeps the
	// admin state per instance (admin.state_file).
	State statestore.Store
	// MaxLeaseTTL is the ledger's bound on every lease, fixed when the
	// ledger opened. Optional; default 2 × the start-up ledger.lease_ttl
	// (both backends' default). A reload may not raise lease_ttl past it.
	MaxLeaseTTL time.Duration
	// Keys is the shared store of API keys created at run time. Optional;
	// nil keeps them in memory (lost on restart, seen by this instance only).
	Keys statestore.Store
	// Responses shares the bodies of completed idempotent responses across
	// a fleet (statestore.RedisBlobs in the Redis layout), so that a retry
	// landing on another instance gets the original response. Optional;
	// nil keeps them per instance.
	Responses settle.ResponseStore
}

// GPU is what the scheduler needs from the GPU monitor (gpu.Monitor):
// replicas joining, leaving and draining, what their scrapes observed, the
// GPU-ms holds and clocks that settlement charges from, and the snapshot the
// status page and sizing read.
type GPU interface {
	AddReplica(rc gpu.Replica) error
	RemoveReplica(name string) error
	Drain(name, reason string) error
	ObserveReplica(name string, obs gpu.ReplicaMetrics) error
	Snapshot() *gpu.Snapshot
	Config() gpu.Config
	Clock(name string) *gpu.Clock
	Estimator(name string) *gpu.Estimator
	Hold(in, out int64) int64
	HoldEnergy(gpuMs int64) int64
	Err() error
}

var _ GPU = (*gpu.Monitor)(nil)

// Auditor is the audit trail (scheduler/audit.Log).
type Auditor interface {
	Append(rec audit.Record) error
}

// Server is the composition root: it wires the call lifecycle
// (scheduler/lifecycle, whose exported methods it carries) to the policy,
// the fleet, the settlement room and the admin state, and supervises the
// process's loops. Create it with [New], run it with [Server.Run]; the
// client edge (scheduler/edge) calls into its lifecycle.
type Server struct {
	*lifecycle.Engine

	// boot is the config file the process started with: what the
	// restart-only fields still run with (RestartNeeded).
	boot *config.File

	led   Ledger
	keyer *ledger.Keyer
	gpu   GPU
	trail Auditor
	owner ledger.Owner
	m     *lifecycle.Metrics
	log   *slog.Logger
	now   func() time.Time
	reps  *fleet.Set
	// memberMu orders replicas joining and leaving (membership.go).
	memberMu sync.Mutex

	pol      atomic.Pointer[policy.Snapshot]
	polMu    sync.Mutex // serializes policy changes; guards runtimes, admin
	runtimes *policy.Runtimes
	admin    *policy.SharedAdmin // budget overrides and clamps, shared through the state store
	keys     *policy.RuntimeKeys // the run-time keys of the shared keys document
	abuse    *abuse.Detector
	// autoClamps carries the detectors' decisions to clampLoop.
	autoClamps chan abuse.Decision

	draining atomic.Bool

	// settler is the settlement room: leases, the pending-writes log,
	// outage charges, idempotent responses (scheduler/settle).
	settler *settle.Settler

	maxLease   time.Duration         // the ledger's lease bound (Deps.MaxLeaseTTL)
	learnRamp  float64               // upstream.learn_ramp (restart only), for replicas added later
	retention  time.Duration         // ledger.tombstone_retention, fixed at start (idempotent replays)
	memoryOnly []string              // state kept in memory only, for /readyz (durable.go)
	ledgerErrs atomic.Int64          // consecutive ledger store errors, for /readyz
	loopErr    atomic.Pointer[error] // the first background loop failure, for /readyz
	attached   attached              // the process's loops Run supervises (supervise.go)
	started    time.Time             // when New ran: uptime starts
	ops        views.OpsSampler      // the status page's samples (statusview.go)
}

// New builds a Server from a validated config.
func New(cfg *config.File, deps Deps) (*Server, error) {
	if deps.Ledger == nil || deps.Upstream == nil || deps.Keyer == nil || deps.GPU == nil {
		return nil, errors.New("scheduler: Ledger, Upstream, Keyer and GPU are required")
	}
	reg := deps.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := lifecycle.NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("scheduler metrics: %w", err)
	}
	s := &Server{
		boot:       cfg,
		led:        deps.Ledger,
		keyer:      deps.Keyer,
		gpu:        deps.GPU,
		trail:      deps.Audit,
		m:          m,
		log:        deps.Logger,
		now:        deps.Now,
		owner:      ledger.NewOwner(),
		runtimes:   policy.NewRuntimes(lifecycle.NewTenantLocal),
		autoClamps: make(chan abuse.Decision, 64),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	keys := deps.Keys
	if keys == nil {
		keys = statestore.NewMemory()
	}
	s.keys = policy.NewRuntimeKeys(keys, s.keyer, s.log, s.now)
	s.started = s.now()
	s.maxLease = deps.MaxLeaseTTL
	if s.maxLease == 0 {
		s.maxLease = 2 * cfg.Ledger.LeaseTTL
	}
	s.retention = cfg.Ledger.Retention()
	if lr := cfg.Upstream.LearnRamp; lr != nil && cfg.Upstream.LearnScrapeInterval < cfg.Upstream.ScrapeInterval {
		// The ramp grows at each scrape: at the scrape interval its climb
		// would take seconds, so it runs with the learning scrape only.
		s.learnRamp = *lr
	}
	if err := s.checkLeaseConfig(cfg); err != nil {
		return nil, err
	}
	adminSt, err := policy.LoadAdminState(cfg.Admin.StateFile)
	if err != nil {
		return nil, err
	}
	s.admin = s.newSharedAdmin(adminSt, deps.State)
	if err := s.admin.Load(context.Background()); err != nil {
		return nil, err
	}
	adminSt = s.admin.State()
	// A networked ledger's Settle may land after the process died: write
	// it ahead.
	if err := s.openSettler(cfg.Paths(), cfg.Ledger.Backend != "memory", deps.Responses); err != nil {
		return nil, err
	}
	s.noteDurability(cfg)
	eff := policy.EffectiveConfig(cfg, &adminSt, s.now())
	pol, err := policy.Build(eff, 1, s.keyer, s.runtimes)
	if err != nil {
		return nil, err
	}
	pol.File, pol.Clamps = cfg, adminSt.Clamps
	s.pol.Store(pol)
	if s.abuse, err = abuse.New(abuse.Config{}, s.now); err != nil {
		return nil, err
	}
	s.configureAbuse(eff)
	s.reps = fleet.NewSet(s.capacityOf)
	var trail func(audit.Record)
	if s.trail != nil { // the lifecycle builds an admission's record only when one is kept
		trail = s.record
	}
	eng, err := lifecycle.New(lifecycle.Deps{
		Ledger: s.led, Upstream: deps.Upstream, Keyer: s.keyer, GPU: s.gpu, Attribution: deps.Attribution,
		Audit: trail, Tracer: deps.Tracer, Metrics: m, Logger: s.log, Now: s.now, Owner: s.owner,
		Queue: lifecycle.QueueConfig(eff), Fleet: s.reps, Settler: s.settler, Policy: &s.pol, Draining: &s.draining,
		Authenticate: s.authenticate, NoteLedger: s.noteLedger, ObserveAbuse: s.observeAbuse,
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	s.Engine = eng
	reps := make([]*fleet.Replica, len(cfg.Upstream.Replicas))
	for i, rc := range cfg.Upstream.Replicas {
		reps[i] = s.newReplica(rc)
		reps[i].Slot = i
	}
	s.reps.SetMembers(reps)
	m.Ready.Set(0)
	return s, nil
}

func (s *Server) capacityOf(name string) (k, base int64, st gpu.State) {
	v, ok := s.gpu.Snapshot().Replica(name)
	if !ok {
		return 0, 0, gpu.StateDown
	}
	return v.CapacityTokens, v.BaseTokens, v.State
}

// Reload applies a new config file (already loaded and validated by
// config.Load) together with the admin state, atomically. Queued and
// running requests keep the limits they were admitted under.
func (s *Server) Reload(cfg *config.File) error {
	if err := s.checkLeaseConfig(cfg); err != nil {
		return err
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	if err := s.rebuildLocked(cfg, s.admin.StateLocked()); err != nil {
		return err
	}
	s.log.Info("config reloaded", "version", s.pol.Load().Version, "tenants", len(cfg.Tenants))
	reason := fmt.Sprintf("policy version %d, %d tenants", s.pol.Load().Version, len(cfg.Tenants))
	if pending := s.RestartNeeded(); len(pending) > 0 {
		s.log.Warn("config reloaded, but these fields apply only at a restart and still run with their start-up value",
			"fields", strings.Join(pending, "; "))
		reason += "; needs a restart: " + strings.Join(pending, "; ")
	}
	s.record(audit.Record{Kind: audit.KindReload, Reason: reason})
	return nil
}

// checkLeaseConfig checks ledger.lease_ttl and ledger.tombstone_retention
// against the ledger: it refuses leases past the bound it opened with
// (every Reserve would then be a 500), so neither start-up nor a reload may
// pass it, and a reload may not change the retention the ledger keeps
// tombstones for (the response cache follows it). queue.max_wait needs no
// bound against lease_ttl: queued calls' leases are renewed like running
// ones (settle/lease.go), and the heartbeat period follows a reloaded lease_ttl.
func (s *Server) checkLeaseConfig(cfg *config.File) error {
	if ttl := cfg.Ledger.LeaseTTL; ttl > s.maxLease {
		return fmt.Errorf("ledger.lease_ttl %s is more than the ledger's lease bound %s, fixed when it opened; restart to raise it", ttl, s.maxLease)
	}
	if r := cfg.Ledger.TombstoneRetention; r != 0 && r != s.retention {
		return fmt.Errorf("ledger.tombstone_retention %s differs from the ledger's %s, fixed when it opened; restart to change it", r, s.retention)
	}
	return nil
}

// Policy returns the current config.
func (s *Server) Policy() *config.File { return s.pol.Load().Cfg }

// openSettler builds the settlement room on the ledger and opens its
// pending-writes log at paths.Pending.
func (s *Server) openSettler(paths config.StatePaths, writeAhead bool, responses settle.ResponseStore) error {
	st, err := settle.New(settle.Deps{Ledger: s.led, Owner: s.owner, LeaseTTL: s.leaseTTL, Now: s.now, Log: s.log,
		NoteLedger: s.noteLedger, Record: s.record, Responses: responses, Retention: s.retention}, paths, writeAhead)
	if err != nil {
		return err
	}
	s.settler = st
	return nil
}

// leaseTTL is the ledger.lease_ttl in force (the settlement room's
// heartbeat follows a reload).
func (s *Server) leaseTTL() time.Duration { return s.pol.Load().LeaseTTL }

// Metrics returns the server's metrics.
func (s *Server) Metrics() *lifecycle.Metrics { return s.m }

// Ready reports whether the server can admit: not draining, no
// background loop failed, the ledger answering, a replica up, GPU
// telemetry readable.
func (s *Server) Ready() (bool, string) {
	switch {
	case s.draining.Load():
		return false, "draining"
	case s.loopErr.Load() != nil:
		return false, "background loop failed: " + (*s.loopErr.Load()).Error()
	case s.ledgerErrs.Load() >= 3:
		return false, "ledger unavailable"
	case !s.reps.AnyUp():
		return false, "no healthy replica"
	}
	if err := s.gpu.Err(); err != nil {
		return false, err.Error()
	}
	return true, "ok"
}

// StartDrain makes new requests fail with 503 draining and /readyz fail.
func (s *Server) StartDrain() {
	if !s.draining.Swap(true) {
		s.m.Ready.Set(0)
		s.log.Info("draining: refusing new requests")
		s.record(audit.Record{Kind: audit.KindDrain, Reason: "drain started"})
	}
}

// Run supervises every background loop of the process (supervise.go)
// until ctx ends, then drains: running requests get up to drain timeout to
// finish, the rest are aborted and settled. A loop that fails is logged
// and fails /readyz (the others keep running: calls in flight still need
// their leases and settlements); Run returns every loop's failure.
func (s *Server) Run(ctx context.Context) error {
	return s.supervise(ctx)
}

func (s *Server) readyLoop(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if ok, _ := s.Ready(); ok {
			s.m.Ready.Set(1)
		} else {
			s.m.Ready.Set(0)
		}
		s.exportLedger(ctx)
		s.sampleOps(s.now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// noteLedger records a ledger call's error class for metrics and /readyz.
func (s *Server) noteLedger(op string, err error) {
	switch {
	case err == nil, errors.Is(err, ledger.ErrDenied):
		if s.ledgerErrs.Swap(0) > 0 {
			// End pending records and charge owed usage now, not at the
			// next tick: the instance may die meanwhile.
			if s.settler.LedgerAnswered() {
				s.log.Info("ledger reachable again: outage allowances reset; owed usage is being charged")
			}
		}
		return
	case ledger.IsStoreError(err):
		s.ledgerErrs.Add(1)
		s.m.LedgerErrors.WithLabelValues(op, "unavailable").Inc()
	case errors.Is(err, ledger.ErrCorrupt):
		s.m.LedgerErrors.WithLabelValues(op, "corrupt").Inc()
		s.log.Error("ledger corrupt state", "op", op, "err", err)
	default:
		s.m.LedgerErrors.WithLabelValues(op, "other").Inc()
	}
}

// exportLedger publishes each tenant's ledger counters as metrics (a
// read-only Snapshot per tenant per second).
func (s *Server) exportLedger(ctx context.Context) {
	pol := s.pol.Load()
	type scope struct {
		name string
		key  ledger.ScopeKey
	}
	scopes := make([]scope, 0, len(pol.Order)+1)
	for _, t := range pol.Order {
		scopes = append(scopes, scope{t.Name, t.ScopeKey})
	}
	if len(pol.Global) > 0 {
		scopes = append(scopes, scope{GlobalTenant, s.keyer.GlobalKey()})
	}
	for _, t := range scopes {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		u, err := s.led.Snapshot(sctx, t.key, t.key)
		cancel()
		if err != nil {
			s.noteLedger("snapshot", err)
			continue
		}
		for d := range ledger.NumDims {
			if !d.Windowed() {
				continue
			}
			s.m.LedgerReserved.WithLabelValues(t.name, d.String()).Set(float64(u.Reserved[d]))
		}
		s.m.LedgerReserved.WithLabelValues(t.name, "slots").Set(float64(u.SlotsInUse))
		s.m.LedgerUnresolved.WithLabelValues(t.name).Set(float64(u.Unresolved))
		var committed [ledger.NumDims]int64
		for _, l := range u.Limits {
			d := l.Limit.Dim
			if d == ledger.Slots {
				continue
			}
			committed[d] = max(committed[d], l.Committed)
			if l.Limit.Max > 0 && l.Limit != policy.ResolutionLimit {
				s.m.BudgetUsed.WithLabelValues(t.name, d.String(), ledger.FormatWindow(l.Limit.Window)).
					Set(float64(l.Committed+l.Reserved) / float64(l.Limit.Max))
			}
		}
		for d := range ledger.NumDims {
			if !d.Windowed() {
				continue
			}
			s.m.LedgerCommitted.WithLabelValues(t.name, d.String()).Set(float64(committed[d]))
		}
		if qs, ok := s.Queue().Stats(t.name); ok {
			s.m.QueueDepth.WithLabelValues(t.name).Set(float64(qs.Depth))
		}
	}
}

// record appends to the audit trail; a failing trail is logged (the trail's
// own Run reports write failures to the process).
func (s *Server) record(rec audit.Record) {
	if s.trail == nil {
		return
	}
	if err := s.trail.Append(rec); err != nil {
		s.log.Error("audit trail append failed", "kind", rec.Kind, "err", err)
	}
}

// configureAbuse gives each tenant its abuse detectors (zero config: off).
func (s *Server) configureAbuse(cfg *config.File) {
	for _, t := range cfg.Tenants {
		if err := s.abuse.Configure(t.Name, t.Abuse); err != nil {
			s.log.Error("abuse detector config refused", "tenant", t.Name, "err", err)
		}
	}
}

// observeAbuse feeds one event to the tenant's detectors; a clamp they
// decide on is applied by clampLoop, off the request goroutine (a clamp
// rebuilds the policy and writes the admin state).
func (s *Server) observeAbuse(tenant string, ev abuse.Event) {
	d, ok := s.abuse.Observe(tenant, ev)
	if !ok {
		return
	}
	select {
	case s.autoClamps <- d:
	default:
		s.log.Error("automatic clamp dropped: too many pending", "tenant", tenant, "detector", d.Detector)
		s.abuse.Lifted(tenant)
	}
}

// clampLoop applies automatic clamps and expires clamps on time.
func (s *Server) clampLoop(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-s.autoClamps:
			s.applyAutoClamp(d)
		case <-t.C:
			s.expireClamps()
		}
	}
}

func (s *Server) applyAutoClamp(d abuse.Decision) {
	s.m.AbuseClamps.WithLabelValues(d.Tenant, d.Detector).Inc()
	_, err := s.SetClamp(Clamp{Tenant: d.Tenant, Concurrency: d.Clamp.Concurrency, Weight: d.Clamp.Weight,
		MaxOutputTokens: d.Clamp.MaxOutputTokens, Models: d.Clamp.Models, Reason: d.Detector + ": " + d.Reason,
		ExpiresAt: d.ExpiresAt, Source: "auto"})
	if err != nil {
		s.log.Error("automatic clamp not applied", "tenant", d.Tenant, "detector", d.Detector, "err", err)
		s.abuse.Lifted(d.Tenant)
	}
}
