package abuse

import (
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Kind says what happened to one of a tenant's requests.
type Kind uint8

// The event kinds. Each finished request is reported exactly once, as
// Settled or as Disconnected, with the usage it was charged.
const (
	// Admitted: the request passed admission (budgets reserved, queued).
	// AtCap says its max output tokens is the tenant's maximum.
	Admitted Kind = iota + 1
	// Settled: the request finished normally; Tokens, USDMicros and GPUMs
	// are what it was charged.
	Settled
	// Denied: the request was refused for budget (a budget denial).
	Denied
	// Disconnected: the request ended because the client went away;
	// Tokens, USDMicros and GPUMs are what it was charged.
	Disconnected
)

// Detector names, as in [Decision.Detector] (and fit for a metric label).
const (
	DetectorSpendRate       = "spend_rate"
	DetectorGPUMsRate       = "gpu_ms_rate"
	DetectorMaxCapBurst     = "max_cap_burst"
	DetectorDisconnectShare = "disconnect_share"
	DetectorDenials         = "denials"
)

// Event is one observation of a tenant's traffic, passed by value.
type Event struct {
	Kind Kind
	// Tokens is input+output tokens charged (Settled, Disconnected).
	Tokens int64
	// USDMicros is spend charged in micro-USD (Settled, Disconnected).
	USDMicros int64
	// GPUMs is GPU time charged in milliseconds (Settled, Disconnected).
	GPUMs int64
	// AtCap marks an Admitted request whose output cap is the tenant's
	// maximum.
	AtCap bool
}

// Decision is a detector firing: apply Clamp to Tenant until ExpiresAt,
// with Source "auto", and write an audit line with Detector and Reason.
type Decision struct {
	Tenant string
	// Detector is one of the Detector* names.
	Detector string
	// Reason is human-readable and carries the numbers, e.g.
	// "tokens rate 20.3× baseline (4100/s vs 202/s over 30s)".
	Reason string
	// Clamp is the configured clamp (Models is a copy the caller owns).
	Clamp Clamp
	// At is when the detector fired; ExpiresAt is At + Clamp.Duration.
	At, ExpiresAt time.Time
}

// Detector watches every tenant's traffic and decides when to clamp one.
// It is safe for concurrent use. It starts no goroutine and does no I/O:
// the server feeds it with [Detector.Observe] and applies what it returns.
//
// Per tenant it keeps two rings of buckets, so memory is bounded and fixed
// by the config: one bucket per second of the detector window (64 bytes
// each; 1.9 KiB for the default 30s) and one bucket per window of the
// baseline plus two (32 bytes each; 0.7 KiB for the default 10m/30s).
// Observe is O(1) (amortised: crossing into a new second or window clears
// the buckets skipped, at most one ring's length) and does not allocate
// once the tenant has been seen.
//
// # Design rationale
//
// Rings of buckets rather than EWMAs: the count detectors (cap bursts,
// disconnects, denials) need exact counts over a sliding window, the
// baseline must exclude the detector window (else a spike dilutes its own
// reference) and the time a clamp was in force (else a sustained abuser
// becomes its own baseline), and both are simple with buckets and awkward
// with an EWMA, whose memory also has no sharp end.
//
// Hysteresis: a detector fires at most once, then the tenant is silent
// until the clamp it asked for expires ([Decision.ExpiresAt]); if the
// abuse continues after that, it fires again. [Detector.Clamped] extends
// the silence for a clamp set or extended by an operator, and
// [Detector.Lifted] replaces it with Config.Cooldown from the lift, so an
// operator's unclamp is respected. Windows overlapping the firing window
// or any clamp are left out of the baseline; while that leaves too little
// of it, the baseline measured when the detector last fired stands in
// (frozen), so a tenant that keeps abusing after its clamp expires is
// judged against its old normal and clamped again, not against its own
// clamped traffic. Lifted drops the frozen baseline: the operator accepted
// the new level, which the baseline then learns.
type Detector struct {
	now func() time.Time
	def *rules // immutable

	mu      sync.RWMutex       // guards tenants and cfgs (not the tenants' state)
	tenants map[string]*tenant // by tenant name
	cfgs    map[string]*rules  // per-tenant overrides of def
}

// rules is a validated, defaulted Config and its ring shape. Immutable.
type rules struct {
	cfg     Config
	enabled bool
	w       int64 // window, seconds (fine ring length)
	b       int64 // baseline, windows (coarse ring length is b+2)
}

func compile(cfg Config, path string) (*rules, error) {
	cfg.ApplyDefaults()
	if err := cfg.Validate(path); err != nil {
		return nil, err
	}
	return &rules{
		cfg:     cfg,
		enabled: cfg.Enabled(),
		w:       int64(cfg.Window / time.Second),
		b:       baselineWindows(cfg.Baseline, cfg.Window),
	}, nil
}

// New returns a Detector that applies cfg (defaulted, then validated with
// path "abuse") to every tenant without its own [Detector.Configure]. A
// nil now means time.Now.
func New(cfg Config, now func() time.Time) (*Detector, error) {
	r, err := compile(cfg, "abuse")
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Detector{now: now, def: r, tenants: map[string]*tenant{}, cfgs: map[string]*rules{}}, nil
}

// Configure gives tenant its own cfg (defaulted, then validated with path
// "abuse"), e.g. on start or reload. If the window or baseline changed, the
// tenant's history is dropped (it has no baseline again); clamp silence is
// kept either way.
func (d *Detector) Configure(tenant string, cfg Config) error {
	r, err := compile(cfg, "abuse")
	if err != nil {
		return fmt.Errorf("tenant %q: %w", tenant, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfgs[tenant] = r
	if t := d.tenants[tenant]; t != nil {
		t.mu.Lock()
		t.reconfigureLocked(r)
		t.mu.Unlock()
	}
	return nil
}

// Forget drops everything known about tenant (e.g. removed on reload).
func (d *Detector) Forget(tenant string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.tenants, tenant)
	delete(d.cfgs, tenant)
}

// Observe records ev for tenant and reports a clamp decision if a detector
// fires. Tenant must be a configured tenant's name (state is kept per
// name). An unknown Kind is ignored.
func (d *Detector) Observe(tenant string, ev Event) (Decision, bool) {
	t := d.get(tenant)
	now := d.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advanceLocked(now)
	t.addLocked(ev)
	return t.evaluateLocked(now)
}

// Check evaluates tenant's detectors at the current time without a new
// event. It reports false for a tenant never observed.
func (d *Detector) Check(tenant string) (Decision, bool) {
	d.mu.RLock()
	t := d.tenants[tenant]
	d.mu.RUnlock()
	if t == nil {
		return Decision{}, false
	}
	now := d.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advanceLocked(now)
	return t.evaluateLocked(now)
}

// Clamped tells the detector that tenant is clamped until until, by an
// operator or by an extension of an automatic clamp: no decision is made
// for it before then, and that time is left out of its baseline.
func (d *Detector) Clamped(tenant string, until time.Time) {
	t := d.get(tenant)
	now := d.now()
	if !until.After(now) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advanceLocked(now)
	t.quietUntil = max(t.quietUntil, until.UnixNano())
	t.taintUntil = max(t.taintUntil, ceilSec(until))
	t.coarse[mod(t.lastK, t.r.b+2)].tainted = true
}

// Lifted tells the detector that an operator lifted tenant's clamp: no
// decision is made for it for Config.Cooldown from now, and its traffic
// from now on counts towards its baseline again.
func (d *Detector) Lifted(tenant string) {
	t := d.get(tenant)
	now := d.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advanceLocked(now)
	t.quietUntil = now.Add(t.r.cfg.Cooldown).UnixNano()
	t.taintUntil = min(t.taintUntil, now.Unix())
	t.frozenOK = false
}

func (d *Detector) get(name string) *tenant {
	d.mu.RLock()
	t := d.tenants[name]
	d.mu.RUnlock()
	if t != nil {
		return t
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if t = d.tenants[name]; t == nil {
		r := d.cfgs[name]
		if r == nil {
			r = d.def
		}
		t = &tenant{name: name}
		t.resetLocked(r, d.now())
		d.tenants[name] = t
	}
	return t
}

// fineBucket is one second of traffic, or the running sum of the window.
type fineBucket struct {
	tokens, usd, gpu                                int64
	admitted, atCap, finished, disconnected, denied int64
}

func (b *fineBucket) add(o *fineBucket) {
	b.tokens += o.tokens
	b.usd += o.usd
	b.gpu += o.gpu
	b.admitted += o.admitted
	b.atCap += o.atCap
	b.finished += o.finished
	b.disconnected += o.disconnected
	b.denied += o.denied
}

func (b *fineBucket) sub(o *fineBucket) {
	b.tokens -= o.tokens
	b.usd -= o.usd
	b.gpu -= o.gpu
	b.admitted -= o.admitted
	b.atCap -= o.atCap
	b.finished -= o.finished
	b.disconnected -= o.disconnected
	b.denied -= o.denied
}

// coarseBucket is one window's spend, for the baseline.
type coarseBucket struct {
	tokens, usd, gpu int64
	// tainted buckets are left out of the baseline: before the tenant's
	// first full window, overlapping a firing window, or under a clamp.
	tainted bool
}

// tenant is one tenant's detector state.
//
// Time is cut into seconds (Unix) for the fine ring and into windows
// (k = second / w) for the coarse ring. The fine ring holds seconds
// (lastSec-w, lastSec]; win is their sum. The coarse ring holds windows
// [lastK-b-1, lastK]; the baseline range is [lastK-b-1, lastK-2], which
// never overlaps the detector window (inside windows lastK-1 and lastK);
// base and baseN are the sum and count of its untainted buckets.
type tenant struct {
	name string // immutable

	mu         sync.Mutex // guards everything below
	r          *rules
	fine       []fineBucket
	win        fineBucket
	lastSec    int64
	coarse     []coarseBucket
	base       coarseBucket
	baseN      int64
	lastK      int64
	firstK     int64 // the window the tenant was first seen in
	quietUntil int64 // Unix ns: no decision before
	taintUntil int64 // Unix s: windows starting before are tainted
	// frozen is the baseline (tokens, usd, gpu per second) when the last
	// decision fired; it stands in while the baseline is unknown because
	// the clamp's windows are left out. Lifted clears it.
	frozen   [3]float64
	frozenOK bool
}

// resetLocked (re)starts the tenant's history at now under r.
func (t *tenant) resetLocked(r *rules, now time.Time) {
	t.r = r
	t.fine = make([]fineBucket, r.w)
	t.coarse = make([]coarseBucket, r.b+2)
	t.win = fineBucket{}
	t.lastSec = now.Unix()
	t.lastK = floorDiv(t.lastSec, r.w)
	t.firstK = t.lastK
	t.rebuildLocked(t.lastK)
}

func (t *tenant) reconfigureLocked(r *rules) {
	if r.w == t.r.w && r.b == t.r.b {
		t.r = r
		return
	}
	now := time.Unix(t.lastSec, 0)
	t.resetLocked(r, now)
}

func (t *tenant) taintedAt(k int64) bool {
	return k <= t.firstK || k*t.r.w < t.taintUntil
}

// rebuildLocked empties the coarse ring for current window k.
func (t *tenant) rebuildLocked(k int64) {
	n := t.r.b + 2
	t.base, t.baseN = coarseBucket{}, 0
	for j := k - n + 1; j <= k; j++ {
		t.coarse[mod(j, n)] = coarseBucket{tainted: t.taintedAt(j)}
		if j <= k-2 && !t.taintedAt(j) {
			t.baseN++
		}
	}
}

// advanceLocked moves both rings to now. A clock that goes back leaves
// them where they are (events land in the latest second).
func (t *tenant) advanceLocked(now time.Time) {
	sec := now.Unix()
	if sec <= t.lastSec {
		return
	}
	w := t.r.w
	if sec-t.lastSec >= w {
		clear(t.fine)
		t.win = fineBucket{}
	} else {
		for s := t.lastSec + 1; s <= sec; s++ {
			b := &t.fine[mod(s, w)]
			t.win.sub(b)
			*b = fineBucket{}
		}
	}
	t.lastSec = sec
	k := floorDiv(sec, w)
	if k <= t.lastK {
		return
	}
	n := t.r.b + 2
	if k-t.lastK >= n {
		t.lastK = k
		t.rebuildLocked(k)
		return
	}
	for j := t.lastK + 1; j <= k; j++ {
		// Window j-b-2 leaves the baseline range and j-2 enters it; j
		// takes the slot of j-b-2.
		out := &t.coarse[mod(j, n)]
		if !out.tainted {
			t.base.tokens -= out.tokens
			t.base.usd -= out.usd
			t.base.gpu -= out.gpu
			t.baseN--
		}
		if in := &t.coarse[mod(j-2, n)]; !in.tainted {
			t.base.tokens += in.tokens
			t.base.usd += in.usd
			t.base.gpu += in.gpu
			t.baseN++
		}
		*out = coarseBucket{tainted: t.taintedAt(j)}
	}
	t.lastK = k
}

func (t *tenant) addLocked(ev Event) {
	var e fineBucket
	switch ev.Kind {
	case Admitted:
		e.admitted = 1
		if ev.AtCap {
			e.atCap = 1
		}
	case Settled, Disconnected:
		e.tokens, e.usd, e.gpu, e.finished = ev.Tokens, ev.USDMicros, ev.GPUMs, 1
		if ev.Kind == Disconnected {
			e.disconnected = 1
		}
		c := &t.coarse[mod(t.lastK, t.r.b+2)]
		c.tokens += ev.Tokens
		c.usd += ev.USDMicros
		c.gpu += ev.GPUMs
	case Denied:
		e.denied = 1
	default:
		return
	}
	t.fine[mod(t.lastSec, t.r.w)].add(&e)
	t.win.add(&e)
}

// baselineLocked returns the baseline rates (tokens, usd, gpu per second)
// and whether there is one: measured (one full baseline of history, at
// least half of it untainted), or else frozen at the last decision.
func (t *tenant) baselineLocked() ([3]float64, bool) {
	if t.lastK-t.r.b-1 > t.firstK && 2*t.baseN >= t.r.b && t.baseN > 0 {
		d := float64(t.baseN) * float64(t.r.w)
		return [3]float64{float64(t.base.tokens) / d, float64(t.base.usd) / d, float64(t.base.gpu) / d}, true
	}
	return t.frozen, t.frozenOK
}

// rateLocked compares a window sum against factor × the reference (the
// baseline rate or the floor, whichever is larger). It returns the window
// rate, the reference and whether the reference is the baseline.
func (t *tenant) rateLocked(winSum int64, base, floor, factor float64, known bool) (rate, ref float64, isBase, fire bool) {
	rate = float64(winSum) / float64(t.r.w)
	ref = floor
	if known && base >= floor && base > 0 {
		ref, isBase = base, true
	}
	return rate, ref, isBase, ref > 0 && rate > factor*ref
}

func (t *tenant) evaluateLocked(now time.Time) (Decision, bool) {
	cfg := &t.r.cfg
	if !t.r.enabled || now.UnixNano() < t.quietUntil {
		return Decision{}, false
	}
	base, known := t.baselineLocked()
	if f := cfg.SpendRateFactor; f > 0 {
		if rate, ref, isBase, fire := t.rateLocked(t.win.tokens, base[0], cfg.MinRate.TokensPerSecond, f, known); fire {
			return t.fireLocked(now, DetectorSpendRate, rateReason("tokens", rate, ref, isBase, cfg.Window))
		}
		if rate, ref, isBase, fire := t.rateLocked(t.win.usd, base[1], cfg.MinRate.USDMicrosPerSecond, f, known); fire {
			return t.fireLocked(now, DetectorSpendRate, rateReason("usd_micros", rate, ref, isBase, cfg.Window))
		}
	}
	if f := cfg.GPUMsRateFactor; f > 0 {
		if rate, ref, isBase, fire := t.rateLocked(t.win.gpu, base[2], cfg.MinRate.GPUMsPerSecond, f, known); fire {
			return t.fireLocked(now, DetectorGPUMsRate, rateReason("gpu_ms", rate, ref, isBase, cfg.Window))
		}
	}
	if m := cfg.MaxCapBurst; m.Count > 0 && t.win.atCap >= m.Count && float64(t.win.atCap) >= m.Share*float64(t.win.admitted) {
		return t.fireLocked(now, DetectorMaxCapBurst, fmt.Sprintf(
			"%d of %d admissions at the max output cap within %s (threshold %d, min share %.2f)",
			t.win.atCap, t.win.admitted, cfg.Window, m.Count, m.Share))
	}
	if s := cfg.DisconnectShare; s.Share > 0 && t.win.finished > 0 && t.win.finished >= s.MinCount &&
		float64(t.win.disconnected) >= s.Share*float64(t.win.finished) {
		return t.fireLocked(now, DetectorDisconnectShare, fmt.Sprintf(
			"client disconnects were %d of %d finished requests (%.0f%%) within %s (threshold %.0f%%, min %d)",
			t.win.disconnected, t.win.finished, 100*float64(t.win.disconnected)/float64(t.win.finished),
			cfg.Window, 100*s.Share, s.MinCount))
	}
	if n := cfg.Denials; n > 0 && t.win.denied >= n {
		return t.fireLocked(now, DetectorDenials, fmt.Sprintf(
			"%d budget denials within %s (threshold %d)", t.win.denied, cfg.Window, n))
	}
	return Decision{}, false
}

// fireLocked makes the decision and starts the silence: until the clamp
// expires no decision is made, and the firing window and the clamp's time
// are left out of the baseline.
func (t *tenant) fireLocked(now time.Time, detector, reason string) (Decision, bool) {
	cl := t.r.cfg.Clamp
	if cl.Models != nil {
		cl.Models = append([]string(nil), cl.Models...)
	}
	if base, ok := t.baselineLocked(); ok {
		t.frozen, t.frozenOK = base, true
	}
	until := now.Add(cl.Duration)
	t.quietUntil = until.UnixNano()
	t.taintUntil = max(t.taintUntil, ceilSec(until))
	n := t.r.b + 2
	t.coarse[mod(t.lastK, n)].tainted = true
	t.coarse[mod(t.lastK-1, n)].tainted = true
	return Decision{Tenant: t.name, Detector: detector, Reason: reason, Clamp: cl, At: now, ExpiresAt: until}, true
}

func rateReason(metric string, rate, ref float64, isBase bool, window time.Duration) string {
	if isBase {
		return fmt.Sprintf("%s rate %.1f× baseline (%s/s vs %s/s over %s)", metric, rate/ref, fmtRate(rate), fmtRate(ref), window)
	}
	return fmt.Sprintf("%s rate %.1f× floor (%s/s vs min_rate %s/s over %s; baseline below floor or not yet known)",
		metric, rate/ref, fmtRate(rate), fmtRate(ref), window)
}

// fmtRate prints whole numbers from 100 up, three significant digits
// below.
func fmtRate(x float64) string {
	if x >= 100 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

func mod(a, n int64) int64 {
	m := a % n
	if m < 0 {
		m += n
	}
	return m
}

func floorDiv(a, n int64) int64 {
	q := a / n
	if a%n != 0 && (a < 0) != (n < 0) {
		q--
	}
	return q
}

// ceilSec is t in Unix seconds, rounded up.
func ceilSec(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}
