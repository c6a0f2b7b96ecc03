package scheduler

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"math"
	"slices"
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
	byKey    map[[32]byte]*apiKey
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
	// keys are the tenant's API keys (config and run time), by position.
	keys []*apiKey
	// cacheSalt is the vLLM cache_salt written into the tenant's requests
	// (cache_isolation: salt); "" for the shared prefix cache.
	cacheSalt string
}

// tenantRuntime is a tenant's live counters, kept across reloads.
type tenantRuntime struct {
	inflight       atomic.Int64 // dispatched, not yet settled (this instance)
	queued         atomic.Int64 // waiting in this instance's queue
	inflightTokens atomic.Int64
	series         atomic.Pointer[tenantSeries]
	// keys are the live counters of the tenant's API keys by hash; written
	// only by buildPolicy (under the server's polMu), read through apiKey.rt.
	keys map[[32]byte]*keyRuntime
	// pred is the tenant's recent outputs, for predicted holds (predict.go).
	pred predictor
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
		byKey:    make(map[[32]byte]*apiKey),
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
		if tc.CacheIsolation == "salt" {
			salt := keyer.Derive("cache_salt", tc.Name)
			// 43 characters of base64 (256 bits), the length vLLM's docs ask
			// of a salt (chat_completion/protocol.py, cache_salt).
			t.cacheSalt = base64.RawURLEncoding.EncodeToString(salt[:])
		}
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
		if !slices.ContainsFunc(t.limits, func(l ledger.Limit) bool { return l.Window > 0 }) {
			t.limits = append(t.limits, resolutionLimit)
		}
		slots := int64(tc.Concurrency)
		if slots == 0 {
			slots = ledger.MaxAmount // unset: no cap (the scope still needs a policy)
		}
		t.limits = append(t.limits, ledger.Limit{Dim: ledger.Slots, Max: slots})
		p.tenants[tc.Name] = t
		p.order = append(p.order, t)
		for i, kc := range tc.APIKeys {
			k, err := buildKey(tc.Name, kc, keyer, rt)
			if err != nil {
				return nil, fmt.Errorf("tenants[%q].api_keys[%d]: %w", tc.Name, i, err)
			}
			p.byKey[k.hash] = k
			t.keys = append(t.keys, k)
		}
	}
	return p, nil
}

// resolutionLimit gives a tenant without a windowed budget one window that
// never binds: the ledger charges an UNRESOLVED record at its hold when its
// first admission window closes, and without any window it never would.
// Warn mode at the ledger's maximum never warns either.
var resolutionLimit = ledger.Limit{Dim: ledger.Requests, Window: time.Hour, Max: ledger.MaxAmount, Mode: ledger.Warn}

// authenticate maps a bearer token to its tenant and key: a key of the
// config file (p.byKey) or one created at run time (rt, may be nil). The
// raw key is hashed at once and never stored or logged. A key whose
// tenant is not configured, or past its expiry, is unknown.
func (p *policy) authenticate(authz []byte, now time.Time, rt *keyIndex) (*tenant, *apiKey, error) {
	tok, ok := strings.CutPrefix(string(authz), "Bearer ")
	if !ok || tok == "" {
		return nil, nil, ErrUnauthorized
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	k := p.byKey[h]
	if k == nil && rt != nil {
		k = rt.byKey[h]
	}
	// The map lookup already matched; the constant-time compare keeps the
	// check honest should the lookup ever become prefix-based.
	if k == nil || subtle.ConstantTimeCompare(k.hash[:], h[:]) != 1 {
		return nil, nil, ErrUnauthorized
	}
	if !k.expiresAt.IsZero() && !now.Before(k.expiresAt) {
		return nil, nil, ErrUnauthorized
	}
	t := p.tenants[k.tenant]
	if t == nil {
		return nil, nil, ErrUnauthorized
	}
	return t, k, nil
}

// priceMicros is the usd_micros of in/out tokens of model, rounded up
// (saturating at ledger.MaxAmount; holds are checked with
// priceMicrosChecked first).
func (p *policy) priceMicros(model string, in, out int64) int64 {
	v, ok := p.priceMicrosChecked(model, in, out)
	if !ok {
		return ledger.MaxAmount
	}
	return v
}

// priceMicrosChecked is priceMicros with overflow checks on prices ×
// tokens; false when the price is outside the ledger's range.
func (p *policy) priceMicrosChecked(model string, in, out int64) (int64, bool) {
	pr, ok := p.prices[model]
	if !ok {
		pr, ok = p.prices["*"]
	}
	if !ok {
		return 0, true
	}
	const lim = math.MaxInt64 / 2
	if in < 0 || out < 0 || pr.InputPerMTok < 0 || pr.OutputPerMTok < 0 ||
		(pr.InputPerMTok > 0 && in > lim/pr.InputPerMTok) || (pr.OutputPerMTok > 0 && out > lim/pr.OutputPerMTok) {
		return 0, false
	}
	v := ceilDiv(in*pr.InputPerMTok+out*pr.OutputPerMTok, 1_000_000)
	return v, v <= ledger.MaxAmount
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
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
