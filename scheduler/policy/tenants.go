package policy

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// ErrUnauthorized refuses a bearer token that names no key in force: no
// token, an unknown key, an expired one, or one whose tenant is gone.
var ErrUnauthorized = errors.New("missing or unknown API key")

// Snapshot is everything admission reads from the config, immutable. A
// reload or an admin change builds a new one and the server swaps it in
// atomically; requests keep the snapshot they were admitted under.
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

// Tenant is one tenant's admission policy plus a pointer to its runtime
// state, which survives reloads.
type Tenant struct {
	Name     string
	Cfg      config.Tenant
	ScopeKey ledger.ScopeKey // the tenant's ledger scope
	Limits   []ledger.Limit  // budgets + slots, as sent with every Reserve
	Warn     map[ledger.Dim]float64
	RT       *TenantRuntime
	// Keys are the tenant's API keys of the config file, by position.
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
	// Keys are the live counters of the tenant's API keys by hash; written
	// only by Build (under the server's policy lock), read through Key.RT.
	Keys map[[32]byte]*KeyRuntime
	// Local is the server's own state of the tenant (cached metric
	// children, the output predictor), made by the Runtimes' newLocal when
	// the tenant first appears, so that it survives reloads too; nil when
	// newLocal is.
	Local any
}

// Runtimes are the tenants' live state by name, kept across rebuilds: a
// tenant's counters stay the same objects while its policy is replaced.
// Not safe for concurrent Builds (the server serializes them).
type Runtimes struct {
	byName   map[string]*TenantRuntime
	newLocal func() any
}

// NewRuntimes returns an empty set whose new tenants get newLocal() as
// their Local (nil: none).
func NewRuntimes(newLocal func() any) *Runtimes {
	return &Runtimes{byName: map[string]*TenantRuntime{}, newLocal: newLocal}
}

// of returns name's runtime, made on first use.
func (r *Runtimes) of(name string) *TenantRuntime {
	rt := r.byName[name]
	if rt == nil {
		rt = &TenantRuntime{}
		if r.newLocal != nil {
			rt.Local = r.newLocal()
		}
		r.byName[name] = rt
	}
	return rt
}

// Allowed reports whether the tenant may use model (tenants[].models).
func (t *Tenant) Allowed(model string) bool {
	return len(t.Cfg.Models) == 0 || slices.Contains(t.Cfg.Models, model)
}

// Build turns a validated config into a snapshot. runtimes carries the
// live counters of tenants that already exist and receives those of new
// ones.
func Build(cfg *config.File, version uint64, keyer *ledger.Keyer, runtimes *Runtimes) (*Snapshot, error) {
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
		rt := runtimes.of(tc.Name)
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
// config file (p.ByKey) or one created at run time (rt, may be nil). The
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
// PriceMicrosChecked first).
func (p *Snapshot) PriceMicros(model string, in, out int64) int64 {
	v, ok := p.PriceMicrosChecked(model, in, out)
	if !ok {
		return ledger.MaxAmount
	}
	return v
}

// PriceMicrosChecked is PriceMicros with overflow checks on prices ×
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

// PriceCached is PriceMicros with the input tokens served from vLLM's
// prefix cache (usage.prompt_tokens_details.cached_tokens) at the model's
// cached_input_per_mtok when it sets one. The admission hold prices all
// input at the full rate, an upper bound of this.
func (p *Snapshot) PriceCached(model string, in, cached, out int64) int64 {
	pr, ok := p.Prices[model]
	if !ok {
		pr, ok = p.Prices["*"]
	}
	if !ok || pr.CachedInputPerMTok <= 0 || cached <= 0 {
		return p.PriceMicros(model, in, out)
	}
	cached = min(cached, in)
	return ceilDiv((in-cached)*pr.InputPerMTok+cached*pr.CachedInputPerMTok+out*pr.OutputPerMTok, 1_000_000)
}

// ClampOf returns the tenant's clamp in force at now, if any.
func (p *Snapshot) ClampOf(tenant string, now time.Time) (Clamp, bool) {
	c, ok := p.Clamps[tenant]
	if !ok || !now.Before(c.ExpiresAt) {
		return Clamp{}, false
	}
	return c, true
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
