package scheduler

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// policy is an immutable snapshot of everything admission reads from the
// config. A reload builds a new one and swaps it in atomically; requests
// keep the policy they were admitted under.
type policy struct {
	version  uint64
	cfg      *config.File // effective: the file plus admin overrides and clamps
	file     *config.File // as loaded from disk
	clamps   map[string]Clamp
	global   []ledger.Limit // fleet-wide budgets, on every request
	tenants  map[string]*tenant
	order    []*tenant // config order
	byKey    map[[32]byte]*tenant
	prices   map[string]config.Price
	maxWait  time.Duration
	leaseTTL time.Duration
}

// tenant is one tenant's admission policy plus a pointer to its runtime
// state, which survives reloads.
type tenant struct {
	name   string
	cfg    config.Tenant
	key    ledger.ScopeKey
	limits []ledger.Limit // budgets + slots, as sent with every Reserve
	warn   map[ledger.Dim]float64
	rt     *tenantRuntime
	// keyHashes are the decoded SHA-256 of cfg.APIKeys, for authenticate.
	keyHashes [][32]byte
}

// tenantRuntime is a tenant's live counters, kept across reloads.
type tenantRuntime struct {
	inflight       atomic.Int64 // dispatched, not yet settled (this instance)
	queued         atomic.Int64 // waiting in this instance's queue
	inflightTokens atomic.Int64
	series         atomic.Pointer[tenantSeries]
}

// tenantSeries holds a tenant's per-request metric children, resolved once
// (label hashing and the vector's map lookup cost on every request
// otherwise). Children are never deleted from the vectors, so a cached one
// stays the exported one.
type tenantSeries struct {
	m          *Metrics
	requestsOK prometheus.Counter
	ttft       prometheus.Observer
	inflight   prometheus.Gauge
	queueWait  prometheus.Observer
}

// series returns t's cached metric children on m, resolving them on first
// use (and again should the server's Metrics ever change).
func (t *tenant) series(m *Metrics) *tenantSeries {
	if ts := t.rt.series.Load(); ts != nil && ts.m == m {
		return ts
	}
	ts := &tenantSeries{
		m:          m,
		requestsOK: m.Requests.WithLabelValues(t.name, "ok"),
		ttft:       m.TTFT.WithLabelValues(t.name),
		inflight:   m.Inflight.WithLabelValues(t.name),
		queueWait:  m.QueueWait.WithLabelValues(t.name),
	}
	t.rt.series.Store(ts)
	return ts
}

// buildPolicy turns a validated config into a policy. runtimes carries the
// live counters of tenants that already exist.
func buildPolicy(cfg *config.File, version uint64, keyer *ledger.Keyer, runtimes map[string]*tenantRuntime) (*policy, error) {
	p := &policy{
		version:  version,
		cfg:      cfg,
		tenants:  make(map[string]*tenant, len(cfg.Tenants)),
		byKey:    make(map[[32]byte]*tenant),
		prices:   make(map[string]config.Price, len(cfg.Prices)),
		maxWait:  cfg.Server.MaxWait,
		leaseTTL: cfg.Ledger.LeaseTTL,
	}
	for _, pr := range cfg.Prices {
		p.prices[pr.Model] = pr
	}
	for _, b := range cfg.Global.Budgets {
		l, err := limitOf(b)
		if err != nil {
			return nil, fmt.Errorf("global: %w", err)
		}
		p.global = append(p.global, l)
	}
	for _, tc := range cfg.Tenants {
		rt := runtimes[tc.Name]
		if rt == nil {
			rt = &tenantRuntime{}
			runtimes[tc.Name] = rt
		}
		t := &tenant{name: tc.Name, cfg: tc, key: keyer.Key(ledger.KindTenant, tc.Name), rt: rt, warn: map[ledger.Dim]float64{}}
		for _, b := range tc.Budgets {
			l, err := limitOf(b)
			if err != nil {
				return nil, fmt.Errorf("tenant %q: %w", tc.Name, err)
			}
			t.limits = append(t.limits, l)
			if w, ok := t.warn[l.Dim]; !ok || b.WarnRatio < w {
				t.warn[l.Dim] = b.WarnRatio
			}
		}
		slots := int64(tc.Concurrency)
		if slots == 0 {
			slots = ledger.MaxAmount // unset: no cap (the scope still needs a policy)
		}
		t.limits = append(t.limits, ledger.Limit{Dim: ledger.Slots, Max: slots})
		p.tenants[tc.Name] = t
		p.order = append(p.order, t)
		for _, k := range tc.APIKeys {
			var h [32]byte
			if _, err := hex.Decode(h[:], []byte(strings.ToLower(strings.TrimPrefix(k, "sha256:")))); err != nil {
				return nil, fmt.Errorf("tenant %q: bad key hash", tc.Name)
			}
			p.byKey[h] = t
			t.keyHashes = append(t.keyHashes, h)
		}
	}
	return p, nil
}

// authenticate maps a bearer token to its tenant. The raw key is hashed at
// once and never stored or logged.
func (p *policy) authenticate(authz []byte) (*tenant, error) {
	tok, ok := strings.CutPrefix(string(authz), "Bearer ")
	if !ok || tok == "" {
		return nil, ErrUnauthorized
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	t := p.byKey[h]
	if t == nil {
		return nil, ErrUnauthorized
	}
	// The map lookup already matched; the constant-time compare keeps the
	// check honest should the lookup ever become prefix-based.
	for i := range t.keyHashes {
		if subtle.ConstantTimeCompare(t.keyHashes[i][:], h[:]) == 1 {
			return t, nil
		}
	}
	return nil, ErrUnauthorized
}

// priceMicros is the usd_micros of in/out tokens of model, rounded up.
func (p *policy) priceMicros(model string, in, out int64) int64 {
	pr, ok := p.prices[model]
	if !ok {
		pr, ok = p.prices["*"]
	}
	if !ok {
		return 0
	}
	return ceilDiv(in*pr.InputPerMTok+out*pr.OutputPerMTok, 1_000_000)
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// gpuMsHold is the admission hold for GPU-ms: the fleet's coefficients
// times the margin, rounded up.
func gpuMsHold(est func(in, out int64) int64, in, out int64) int64 {
	if est == nil {
		return 0
	}
	v := est(in, out)
	if v < 0 || v > math.MaxInt32*int64(1000) {
		return 0
	}
	return v
}

// limitOf converts a config budget to a ledger limit.
func limitOf(b config.Budget) (ledger.Limit, error) {
	d, err := ledger.ParseDim(b.Dimension)
	if err != nil {
		return ledger.Limit{}, err
	}
	mode := ledger.Block
	if b.Mode == "warn" {
		mode = ledger.Warn
	}
	return ledger.Limit{Dim: d, Window: b.Window, Max: b.Limit, Mode: mode}, nil
}
