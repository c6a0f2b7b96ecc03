package vllm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Target is one replica to poll.
type Target struct {
	// Name is the replica's configured name (metrics label).
	Name string
	// URL is the replica's base URL, e.g. http://127.0.0.1:8100.
	URL string
	// Model filters metrics by model_name. Optional; "" accepts all.
	Model string
}

// PollerConfig configures a [Poller].
type PollerConfig struct {
	// Replicas are polled in this order; Snapshot keeps it.
	Replicas []Target
	// Interval between polls. Optional; default 1s.
	Interval time.Duration
	// FastInterval, when above zero and below Interval, is the interval
	// between polls of a replica for which Fast reports true and whose
	// last poll did not fail (a failing replica stays at Interval, so that
	// DownAfter counts polls Interval apart). Optional; 0: off.
	FastInterval time.Duration
	// Fast reports whether a replica is to be polled at FastInterval, e.g.
	// while its consumer still learns something from its scrapes. Run asks
	// it on every FastInterval tick, from one goroutine; it must not block.
	// Optional; nil: never.
	Fast func(replica string) bool
	// Timeout bounds one replica's /metrics plus /health. Optional; default
	// the interval.
	Timeout time.Duration
	// DownAfter is the number of consecutive failed polls (scrape or
	// health) after which a replica is down. Optional; default 3.
	DownAfter int
	// Concurrency bounds replicas polled at once. Optional; default 16.
	Concurrency int
	// Now is the clock. Optional; default time.Now.
	Now func() time.Time
	// Scrape, when set, is called as a replica's /metrics request is sent;
	// the function it returns (when not nil) is called with the parsed
	// metrics as the answer arrives, before /health is read, and not at
	// all when the scrape fails. The caller reads its own counters at
	// both ends of the scrape: what it sent meanwhile may be missing from
	// the metrics, what ended meanwhile may still be in them. Optional.
	Scrape func(replica string) func(*Metrics)
}

// Validate names every problem.
func (c PollerConfig) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, t := range c.Replicas {
		if t.Name == "" {
			errs = append(errs, fmt.Errorf("upstream.replicas[%d].name is required", i))
		} else if seen[t.Name] {
			errs = append(errs, fmt.Errorf("upstream.replicas[%d].name %q is duplicated", i, t.Name))
		}
		seen[t.Name] = true
		if !strings.HasPrefix(t.URL, "http://") && !strings.HasPrefix(t.URL, "https://") {
			errs = append(errs, fmt.Errorf("upstream.replicas[%d].url must start with http:// or https://", i))
		}
	}
	if c.Interval < 0 {
		errs = append(errs, errors.New("upstream.scrape_interval must be >= 0"))
	}
	if c.FastInterval < 0 {
		errs = append(errs, errors.New("upstream.learn_scrape_interval must be >= 0"))
	}
	if c.Timeout < 0 {
		errs = append(errs, errors.New("upstream.scrape_timeout must be >= 0"))
	}
	if c.DownAfter < 0 {
		errs = append(errs, errors.New("upstream.down_after must be >= 0"))
	}
	if c.Concurrency < 0 {
		errs = append(errs, errors.New("upstream.scrape_concurrency must be >= 0"))
	}
	return errors.Join(errs...)
}

// Replica is an immutable snapshot of one replica's state. Never modify a
// Replica obtained from a Poller.
type Replica struct {
	Name, URL, Model string
	// Metrics from the last successful scrape (all unknown before one).
	Metrics Metrics
	// Healthy reports that the last /health answered 200.
	Healthy bool
	// Up is false once DownAfter polls in a row failed (and before the
	// first successful poll).
	Up bool
	// Failures counts consecutive failed polls.
	Failures int
	// ScrapedAt is when Metrics were read (zero if never): staleness is
	// now − ScrapedAt.
	ScrapedAt time.Time
	// CheckedAt is the time of the last poll.
	CheckedAt time.Time
	// Restarted reports that a counter dropped at the last scrape; Restarts
	// counts such drops since the poller started.
	Restarted bool
	Restarts  int
	// LastError describes the last failure ("" after a good poll); it
	// joins Failed, so it names no URL or credential either.
	LastError string
	// Failed are the endpoints that failed in the last poll that had a
	// failure, at FailedAt (zero: none since the poller started). Kept
	// after later good polls; Failures > 0 says the last poll failed too.
	Failed   []ScrapeFailure
	FailedAt time.Time
	// TimedOut reports that the last poll failed only by running out of
	// Timeout: no refused connection, no error status. Under heavy load
	// vLLM's API server answers /metrics late on the same event loop that
	// serves requests, so this alone says the replica is slow, not dead.
	TimedOut bool
}

// Fresh reports whether the replica is up and its metrics are at most maxAge
// old at now. Use it before trusting Metrics for dispatch.
func (r *Replica) Fresh(now time.Time, maxAge time.Duration) bool {
	return r.Up && !r.ScrapedAt.IsZero() && now.Sub(r.ScrapedAt) <= maxAge
}

// Poller scrapes every replica's /metrics and /health on an interval and
// publishes immutable snapshots. Snapshot and Get never lock and are safe
// for concurrent use; Run must be called once.
type Poller struct {
	cfg    PollerConfig
	client *Client
	snap   atomic.Pointer[pollSnap]
	polled chan struct{} // Polled
	// mu orders publishing a round of polls against SetTargets, so that
	// neither loses the other's change (pollertargets.go).
	mu sync.Mutex
	// pollFn polls one replica: pollReplica, or a test's stand-in.
	pollFn func(context.Context, *Replica) *Replica

	errs *prometheus.CounterVec
	up   *prometheus.GaugeVec
}

// NewPoller builds a Poller. reg may be nil (no metrics registered).
func NewPoller(cfg PollerConfig, client *Client, reg prometheus.Registerer) (*Poller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = cfg.Interval
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = 3
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if client == nil {
		client = NewClient(Config{})
	}
	p := &Poller{
		cfg:    cfg,
		client: client,
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_vllm_poll_errors_total",
			Help: "Failed replica polls, by replica and what failed (metrics, health).",
		}, []string{"replica", "kind"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_vllm_replica_up",
			Help: "1 while the replica is up (fewer than down_after failed polls in a row).",
		}, []string{"replica"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{p.errs, p.up} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register poller metrics: %w", err)
			}
		}
	}
	rs := make([]*Replica, len(cfg.Replicas))
	for i, t := range cfg.Replicas {
		rs[i] = &Replica{Name: t.Name, URL: t.URL, Model: t.Model}
	}
	p.snap.Store(newPollSnap(rs))
	p.polled = make(chan struct{}, 1)
	p.pollFn = p.pollReplica
	return p, nil
}

// Polled receives once a round of polls has been published (PollOnce): a
// consumer acts on a scrape as it lands instead of on a ticker of its own,
// which would see it up to an interval late. At most one signal waits.
func (p *Poller) Polled() <-chan struct{} { return p.polled }

// Snapshot returns the latest snapshots, in configuration order. The slice
// and its elements are immutable and shared: do not modify them.
func (p *Poller) Snapshot() []*Replica { return p.snap.Load().reps }

// Get returns the latest snapshot of the named replica.
func (p *Poller) Get(name string) (*Replica, bool) {
	sn := p.snap.Load()
	i, ok := sn.index[name]
	if !ok {
		return nil, false
	}
	return sn.reps[i], true
}

// Run polls at once and then every Interval until ctx is cancelled; it
// returns nil then. With FastInterval and Fast set it wakes every
// FastInterval and polls the replicas due then (pollDue). Call it exactly
// once.
func (p *Poller) Run(ctx context.Context) error {
	fast := p.cfg.Fast != nil && p.cfg.FastInterval > 0 && p.cfg.FastInterval < p.cfg.Interval
	tick := p.cfg.Interval
	if fast {
		tick = p.cfg.FastInterval
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	last := map[string]time.Time{} // when each replica's last poll was due
	for {
		if fast {
			p.pollDue(ctx, last)
		} else {
			p.PollOnce(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// pollDue polls the replicas whose interval (FastInterval while Fast says
// so, else Interval) has passed since last[name], within half a tick: the
// ticks run late by the polls' own time, and a replica at Interval is
// polled on the tick nearest its due time, not one tick after it.
func (p *Poller) pollDue(ctx context.Context, last map[string]time.Time) {
	// The runtime's clock, as the ticker's: Now stamps snapshots and may be
	// set apart from it.
	now := time.Now()
	slack := p.cfg.FastInterval / 2
	keep := make(map[string]bool, len(last))
	p.poll(ctx, func(r *Replica) bool {
		keep[r.Name] = true
		iv := p.cfg.Interval
		if r.Failures == 0 && p.cfg.Fast(r.Name) {
			iv = p.cfg.FastInterval
		}
		if at, ok := last[r.Name]; ok && now.Sub(at) < iv-slack {
			return false
		}
		last[r.Name] = now
		return true
	})
	for name := range last {
		if !keep[name] {
			delete(last, name) // no longer a target
		}
	}
}

// PollOnce polls every replica once and publishes the new snapshots. Run
// calls it; tests and a startup readiness check may call it directly (not
// concurrently with itself).
func (p *Poller) PollOnce(ctx context.Context) {
	p.poll(ctx, func(*Replica) bool { return true })
}

// poll polls the replicas for which due reports true (asked in target
// order, before any is polled), publishes the round and signals Polled;
// it does nothing when none is due.
func (p *Poller) poll(ctx context.Context, due func(*Replica) bool) {
	prev := p.snap.Load().reps
	next := make([]*Replica, len(prev))
	some := false
	for i, r := range prev {
		next[i] = r
		if due(r) {
			next[i], some = nil, true
		}
	}
	if !some && len(prev) > 0 {
		return
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(p.cfg.Concurrency)
	for i, r := range prev {
		if next[i] != nil {
			continue
		}
		g.Go(func() error {
			next[i] = p.pollFn(gctx, r)
			return nil
		})
	}
	_ = g.Wait()
	p.publish(next)
	select {
	case p.polled <- struct{}{}:
	default: // one is already waiting: it covers this round too
	}
}

func (p *Poller) pollReplica(ctx context.Context, prev *Replica) *Replica {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	r := *prev
	r.CheckedAt = p.cfg.Now()
	r.Restarted = false
	base := strings.TrimSuffix(r.URL, "/")

	var failed []ScrapeFailure
	definite := false // a failure that is not the deadline passing
	var answered func(*Metrics)
	if p.cfg.Scrape != nil {
		answered = p.cfg.Scrape(r.Name)
	}
	status, body, err := p.client.get(ctx, base+"/metrics")
	switch {
	case err != nil:
		definite = definite || ctx.Err() == nil
		failed = append(failed, ScrapeFailure{"/metrics", ShowError(err)})
		p.errs.WithLabelValues(r.Name, "metrics").Inc()
	case status != http.StatusOK:
		definite = true
		failed = append(failed, ScrapeFailure{"/metrics", fmt.Sprintf("status %d", status)})
		p.errs.WithLabelValues(r.Name, "metrics").Inc()
	default:
		m := ParseMetrics(body, r.Model)
		if !prev.ScrapedAt.IsZero() && m.CounterDropped(&prev.Metrics) {
			r.Restarted = true
			r.Restarts++
		}
		r.Metrics = m
		r.ScrapedAt = p.cfg.Now()
		if answered != nil {
			answered(&r.Metrics)
		}
	}
	hs, _, err := p.client.get(ctx, base+"/health")
	r.Healthy = err == nil && hs == http.StatusOK
	if !r.Healthy {
		if err != nil {
			definite = definite || ctx.Err() == nil
			failed = append(failed, ScrapeFailure{"/health", ShowError(err)})
		} else {
			definite = true
			failed = append(failed, ScrapeFailure{"/health", fmt.Sprintf("status %d", hs)})
		}
		p.errs.WithLabelValues(r.Name, "health").Inc()
	}
	r.TimedOut = len(failed) > 0 && !definite
	if len(failed) == 0 {
		r.Failures = 0
		r.LastError = ""
		r.Up = true
	} else {
		r.Failures++
		msgs := make([]string, len(failed))
		for i, f := range failed {
			msgs[i] = f.String()
		}
		r.LastError = strings.Join(msgs, "; ")
		r.Failed, r.FailedAt = failed, r.CheckedAt
		if r.Failures >= p.cfg.DownAfter {
			r.Up = false
		}
	}
	if r.Up {
		p.up.WithLabelValues(r.Name).Set(1)
	} else {
		p.up.WithLabelValues(r.Name).Set(0)
	}
	return &r
}
