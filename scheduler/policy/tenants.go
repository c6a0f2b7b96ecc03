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

// Snapshot is an immutable snapshot of everything admission reads from the
// config. A reload builds a new one and swaps it in atomically; requests
// keep the Snapshot they were admitted under.
type Snapshot struct {
	Version  uint64
	Cfg      *config.File // effective: the file plus admin overrides and clamps
	File     *config.File // as loaded from disk
	Clamps   map[string]Clamp
	Global   []ledger.Limit // fleet-wide budgets, on every request
	Tenants  map[string]*Tenant
	Order    []*Tenant // config order
	ByKey    map[[32]byte]*Key
	Prices   map[string]config.Price
	MaxWait  time.Duration
	LeaseTTL time.Duration
}

// Tenant is one Tenant's admission policy plus a pointer to its runtime
// state, which survives reloads.
type Tenant struct {
	Name   string
	Cfg    config.Tenant
	ScopeKey    ledger.ScopeKey
	Limits []ledger.Limit // budgets + slots, as sent with every Reserve
	Warn   map[ledger.Dim]float64
	RT     *TenantRuntime
	// Keys are the tenant's API Keys (config and run time), by position.
	Keys []*Key
	// CacheSalt is the vLLM cache_salt written into the tenant's requests
	// (cache_isolation: salt); "" for the shared prefix cache.
	CacheSalt string
}

// TenantRuntime is a tenant's live counters, kept across reloads.
type TenantRuntime struct {
	Inflight       atomic.Int64 // dispatched, not yet settled (this instance)
	Queued         atomic.Int64 // waiting in this instance's queue
	InflightTokens atomic.Int64
	series         atomic.Pointer[tenantSeries]
	// Keys are the live counters of the tenant's API Keys by hash; written
	// only by buildPolicy (under the server's polMu), read through apiKey.rt.
	Keys map[[32]byte]*KeyRuntime
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
func (t *Tenant) series(m *Metrics) *tenantSeries {
	if ts := t.RT.series.Load(); ts != nil && ts.m == m {
		return ts
	}
	ts := &tenantSeries{
		m:          m,
		requestsOK: m.Requests.WithLabelValues(t.Name, "ok"),
		ttft:       m.TTFT.WithLabelValues(t.Name),
		inflight:   m.Inflight.WithLabelValues(t.Name),
		queueWait:  m.QueueWait.WithLabelValues(t.Name),
	}
	t.RT.series.Store(ts)
	return ts
}

// Build turns a validated config into a policy. runtimes carries the
// live counters of tenants that already exist.
func Build(cfg *config.File, version uint64, keyer *ledger.Keyer, runtimes map[string]*TenantRuntime) (*Snapshot, error) {
	p := &Snapshot{
		Version:  version,
		Cfg:      cfg,
		Tenants:  make(map[string]*Tenant, len(cfg.Tenants)),
		ByKey:    make(map[[32]byte]*Key),
		Prices:   make(map[string]config.Price, len(cfg.Prices)),
		MaxWait:  cfg.Server.MaxWait,
		LeaseTTL: cfg.Ledger.LeaseTTL,
	}
	for _, pr := range cfg.Prices {
		p.Prices[pr.Model] = pr
	}
	for _, b := range cfg.Global.Budgets {
		l, err := LimitOf(b)
		if err != nil {
			return nil, fmt.Errorf("global: %w", err)
		}
		p.Global = append(p.Global, l)
	}
	for _, tc := range cfg.Tenants {
		rt := runtimes[tc.Name]
		if rt == nil {
			rt = &TenantRuntime{}
			runtimes[tc.Name] = rt
		}
		t := &Tenant{Name: tc.Name, Cfg: tc, ScopeKey: keyer.Key(ledger.KindTenant, tc.Name), RT: rt, Warn: map[ledger.Dim]float64{}}
		if tc.CacheIsolation == "salt" {
			salt := keyer.Derive("cache_salt", tc.Name)
			// 43 characters of base64 (256 bits), the length vLLM's docs ask
			// of a salt (chat_completion/protocol.py, cache_salt).
			t.CacheSalt = base64.RawURLEncoding.EncodeToString(salt[:])
		}
		for _, b := range tc.Budgets {
			l, err := LimitOf(b)
			if err != nil {
				return nil, fmt.Errorf("tenant %q: %w", tc.Name, err)
			}
			t.Limits = append(t.Limits, l)
			if w, ok := t.Warn[l.Dim]; !ok || b.WarnRatio < w {
				t.Warn[l.Dim] = b.WarnRatio
			}
		}
		if !slices.ContainsFunc(t.Limits, func(l ledger.Limit) bool { return l.Window > 0 }) {
			t.Limits = append(t.Limits, ResolutionLimit)
		}
		slots := int64(tc.Concurrency)
		if slots == 0 {
			slots = ledger.MaxAmount // unset: no cap (the scope still needs a policy)
		}
		t.Limits = append(t.Limits, ledger.Limit{Dim: ledger.Slots, Max: slots})
		p.Tenants[tc.Name] = t
		p.Order = append(p.Order, t)
		for i, kc := range tc.APIKeys {
			k, err := BuildKey(tc.Name, kc, keyer, rt)
			if err != nil {
				return nil, fmt.Errorf("tenants[%q].api_keys[%d]: %w", tc.Name, i, err)
			}
			p.ByKey[k.Hash] = k
			t.Keys = append(t.Keys, k)
		}
	}
	return p, nil
}

// ResolutionLimit gives a tenant without a windowed budget one window that
// never binds: the ledger charges an UNRESOLVED record at its hold when its
// first admission window closes, and without any window it never would.
// Warn mode at the ledger's maximum never warns either.
var ResolutionLimit = ledger.Limit{Dim: ledger.Requests, Window: time.Hour, Max: ledger.MaxAmount, Mode: ledger.Warn}

// Authenticate maps a bearer token to its tenant and key: a key of the
// config file (p.byKey) or one created at run time (rt, may be nil). The
// raw key is hashed at once and never stored or logged. A key whose
// tenant is not configured, or past its expiry, is unknown.
func (p *Snapshot) Authenticate(authz []byte, now time.Time, rt *KeyIndex) (*Tenant, *Key, error) {
	tok, ok := strings.CutPrefix(string(authz), "Bearer ")
	if !ok || tok == "" {
		return nil, nil, ErrUnauthorized
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	k := p.ByKey[h]
	if k == nil && rt != nil {
		k = rt.ByKey[h]
	}
	// The map lookup already matched; the constant-time compare keeps the
	// check honest should the lookup ever become prefix-based.
	if k == nil || subtle.ConstantTimeCompare(k.Hash[:], h[:]) != 1 {
		return nil, nil, ErrUnauthorized
	}
	if !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt) {
		return nil, nil, ErrUnauthorized
	}
	t := p.Tenants[k.Tenant]
	if t == nil {
		return nil, nil, ErrUnauthorized
	}
	return t, k, nil
}

// PriceMicros is the usd_micros of in/out tokens of model, rounded up
// (saturating at ledger.MaxAmount; holds are checked with
// priceMicrosChecked first).
func (p *Snapshot) PriceMicros(model string, in, out int64) int64 {
	v, ok := p.PriceMicrosChecked(model, in, out)
	if !ok {
		return ledger.MaxAmount
	}
	return v
}

// PriceMicrosChecked is priceMicros with overflow checks on prices ×
// tokens; false when the price is outside the ledger's range.
func (p *Snapshot) PriceMicrosChecked(model string, in, out int64) (int64, bool) {
	pr, ok := p.Prices[model]
	if !ok {
		pr, ok = p.Prices["*"]
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

// LimitOf converts a config budget to a ledger limit.
func LimitOf(b config.Budget) (ledger.Limit, error) {
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
