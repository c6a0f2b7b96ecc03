package lifecycle

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/views"
)

// Metrics are the server's Prometheus series (ARCHITECTURE.md §3.4 plus
// extensions). Replica capacity and health, GPU utilisation and memory and
// per-tenant GPU-ms are exported by package gpu on the same registry.
// Tenant labels come from config (bounded); API keys never appear in labels.
type Metrics struct {
	Requests         *prometheus.CounterVec   // tenant, outcome
	Rejections       *prometheus.CounterVec   // tenant, reason
	QueueDepth       *prometheus.GaugeVec     // tenant
	QueueWait        *prometheus.HistogramVec // tenant
	Inflight         *prometheus.GaugeVec     // tenant
	LedgerReserved   *prometheus.GaugeVec     // tenant, dimension
	LedgerCommitted  *prometheus.GaugeVec     // tenant, dimension
	LedgerUnresolved *prometheus.GaugeVec     // tenant
	LedgerErrors     *prometheus.CounterVec   // op, kind
	UpstreamAborts   *prometheus.CounterVec   // replica, cause
	ReplicaInflight  *prometheus.GaugeVec     // replica
	ReplicaAborts    *prometheus.GaugeVec     // replica: aborts held (fleet/sizing.go)
	ReplicaShare     *prometheus.GaugeVec     // replica: this instance's sequence share (fleet/share.go)
	ReplicaBatch     *prometheus.GaugeVec     // replica: the batch learned from its scrapes (fleet/sizing.go)
	ReplicaService   *prometheus.GaugeVec     // replica: its mean request latency as it reports it (fleet/latency.go)
	ReplicaReserve   *prometheus.GaugeVec     // replica: what its pool's gate keeps free for light tenants (gate.Gate.Reserved)
	UpstreamLatency  *prometheus.HistogramVec // replica
	TTFT             *prometheus.HistogramVec // tenant
	BudgetUsed       *prometheus.GaugeVec     // tenant, dimension, window
	AbuseClamps      *prometheus.CounterVec   // tenant, detector
	OutageAdmissions *prometheus.CounterVec   // tenant
	APIKeyAdmissions *prometheus.CounterVec   // tenant, key (configured name), result
	ExpiredDispatch  prometheus.Counter
	IllegalMoves     prometheus.Counter // call lifecycle transitions it does not have (lifecycle.go)
	Ready            prometheus.Gauge
	Usage            *prometheus.CounterVec // tenant, key, model, dimension (usage.go)
	Durable          *prometheus.GaugeVec   // what: 1 durable, 0 memory only (durable.go)
	FairShareFleet   prometheus.Gauge       // 1 fleet-wide fair share, 0 local (fairshare.go)

	recent views.RefusalLog // the last refusals, for the status page
	now    func() time.Time // the refusal log's clock: the engine's
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// NewMetrics creates the series and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		now: time.Now,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_requests_total",
			Help: "Requests by final outcome (ok, rejected, expired, cancelled, upstream_error)."}, []string{"tenant", "outcome"}),
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rejections_total",
			Help: "Refused requests by error code."}, []string{"tenant", "reason"}),
		QueueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_queue_depth",
			Help: "Requests waiting in the tenant's queue."}, []string{"tenant"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_queue_wait_seconds",
			Help: "Time from arrival to dispatch.", Buckets: latencyBuckets}, []string{"tenant"}),
		Inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_inflight_requests",
			Help: "Requests dispatched upstream and not yet settled."}, []string{"tenant"}),
		LedgerReserved: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_ledger_reserved",
			Help: "In-flight holds per budget dimension."}, []string{"tenant", "dimension"}),
		LedgerCommitted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_ledger_committed",
			Help: "Committed usage in the current window of the tenant's tightest budget per dimension."}, []string{"tenant", "dimension"}),
		LedgerUnresolved: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_ledger_unresolved",
			Help: "Reservations whose outcome is unknown (kept held until resolved)."}, []string{"tenant"}),
		LedgerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_ledger_errors_total",
			Help: "Ledger calls that failed, by operation and kind (unavailable, corrupt, ...)."}, []string{"op", "kind"}),
		UpstreamAborts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_upstream_aborts_total",
			Help: "Upstream requests aborted by closing the connection."}, []string{"replica", "cause"}),
		ReplicaInflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_replica_inflight_tokens",
			Help: "Input plus allowed output tokens of requests running on the replica."}, []string{"replica"}),
		ReplicaAborts: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_replica_aborts_held",
			Help: "1 while aborted requests keep their slot on the replica until a scrape: it showed sequences this instance cannot account for (another instance's, or ignored aborts)."}, []string{"replica"}),
		ReplicaShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_replica_seq_share",
			Help: "This instance's cap on its requests on a replica other instances also use (its fair share of max_num_seqs); 0: no cap."}, []string{"replica"}),
		ReplicaBatch: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_replica_learned_batch",
			Help: "The sequences the replica really runs, learned from scrapes that show requests waiting inside vLLM while running stays flat; Sluice dispatches only into that room. 0: none learned (max_num_seqs applies)."}, []string{"replica"}),
		ReplicaService: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_replica_service_seconds",
			Help: "The replica's mean request latency from its own vllm:e2e_request_latency_seconds, about the last ten completions whoever sent them: the service time the dispatch gate reads a tenant's rate against until anything has completed on the pool through this instance. 0: unknown."}, []string{"replica"}),
		ReplicaReserve: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_replica_reserve_ratio",
			Help: "The most of the replica's pool (the replicas serving its models) the dispatch gate kept free for light tenants' demand peaks beside a heavy tenant over the last 5-10 s: their peaks and forecast with server.reserve_margin's Poisson deviations, at least server.headroom, at most server.reserve_cap. Room a heavy tenant may not use while it is free. 0: no heavy tenant assessed in the last 5 s; 1: the reserve covers the pool, so a heavy tenant runs only its one-request floor."}, []string{"replica"}),
		UpstreamLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_upstream_latency_seconds",
			Help: "Time from dispatch to the replica's first byte.", Buckets: latencyBuckets}, []string{"replica"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_ttft_seconds",
			Help: "Time from arrival to the first token sent to the client.", Buckets: latencyBuckets}, []string{"tenant"}),
		BudgetUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_budget_used_ratio",
			Help: "(committed + reserved) / limit of each tenant budget."}, []string{"tenant", "dimension", "window"}),
		AbuseClamps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_abuse_clamps_total",
			Help: "Automatic clamps applied by the abuse detectors."}, []string{"tenant", "detector"}),
		OutageAdmissions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_outage_admissions_total",
			Help: "Requests admitted on a tenant's outage allowance while the ledger was unreachable."}, []string{"tenant"}),
		APIKeyAdmissions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_api_key_admissions_total",
			Help: "Admission decisions per API key: admitted, or denied by a budget of any scope. Keys are labelled by configured name only; unnamed keys share _unnamed."},
			[]string{"tenant", "key", "result"}),
		ExpiredDispatch: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_expired_dispatch_total",
			Help: "Requests dispatched after their deadline; must stay 0."}),
		IllegalMoves: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_lifecycle_illegal_transitions_total",
			Help: "Call lifecycle transitions the lifecycle does not have, refused and logged: a bug; must stay 0."}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_ready",
			Help: "1 while /readyz passes."}),
		Usage:          newUsageCounter(),
		Durable:        newDurableGauge(),
		FairShareFleet: newFairShareGauge(),
	}
	for _, c := range []prometheus.Collector{m.Requests, m.Rejections, m.QueueDepth, m.QueueWait, m.Inflight,
		m.LedgerReserved, m.LedgerCommitted, m.LedgerUnresolved, m.LedgerErrors, m.UpstreamAborts,
		m.ReplicaInflight, m.ReplicaAborts, m.ReplicaShare, m.ReplicaBatch, m.ReplicaService, m.ReplicaReserve, m.UpstreamLatency, m.TTFT,
		m.BudgetUsed, m.AbuseClamps, m.OutageAdmissions, m.APIKeyAdmissions, m.ExpiredDispatch, m.IllegalMoves, m.Ready, m.Usage, m.Durable,
		m.FairShareFleet} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Outcome is a request's final outcome, the label of sluice_requests_total.
type Outcome uint8

const (
	outcomeOK Outcome = iota
	outcomeRejected
	outcomeExpired
	outcomeCancelled
	outcomeUpstreamError
)

var outcomeNames = [...]string{"ok", "rejected", "expired", "cancelled", "upstream_error"}

func (o Outcome) String() string { return outcomeNames[o] }

// outcomeFor classifies an error (nil: ok) through apierr.For, the one
// error→status map, so metrics and responses cannot disagree. A failure
// after the 200 headers is never a rejection.
func outcomeFor(err error) (Outcome, *apierr.Error) {
	if err == nil {
		return outcomeOK, nil
	}
	ae := apierr.For(err)
	switch {
	case ae.Status == 499:
		return outcomeCancelled, ae
	case ae.Status == 504:
		return outcomeExpired, ae
	case ae.Status == 502, apierr.IsMidStream(err):
		return outcomeUpstreamError, ae
	}
	return outcomeRejected, ae
}

// RecentRefusals are the last refusals, newest first (the status page).
func (m *Metrics) RecentRefusals() []views.Refusal { return m.recent.Recent() }

// count records one request's outcome; refusals also count by code.
func (m *Metrics) count(tenant string, o Outcome, ae *apierr.Error) {
	m.Requests.WithLabelValues(tenant, o.String()).Inc()
	if (o == outcomeRejected || o == outcomeExpired) && ae != nil {
		m.Rejections.WithLabelValues(tenant, ae.Code).Inc()
		m.recent.Add(views.Refusal{At: m.now().UTC(), Tenant: tenant, Status: ae.Status, Code: ae.Code, Message: ae.Message})
	}
}

// upLatency is r's upstream latency histogram.
func (e *Engine) upLatency(r *fleet.Replica) prometheus.Observer {
	if r.UpLatency != nil {
		return r.UpLatency
	}
	return e.m.UpstreamLatency.WithLabelValues(r.Name)
}

// newDurableGauge is sluice_durable_state{what}: 1 where that state
// survives a restart, 0 where it is kept in memory only.
func newDurableGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_durable_state",
		Help: "1 where this state survives a restart (kept in data_dir, a path key's file, or Redis), 0 where it is kept in memory only: ledger, shared_state, admin_state, outage_charges, pending_endings."},
		[]string{"what"})
}

// newFairShareGauge is sluice_fair_share_fleet.
func newFairShareGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_fair_share_fleet",
		Help: "1 while dispatch order follows fleet-wide fair-share counters (an exchange with the other instances answered within the last 2 s), 0 while it is fair among this instance's requests only (server.fair_share: local, no Redis ledger, or the exchange failing)."})
}
