package workload

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Options resolves what a workload file leaves to the command line.
type Options struct {
	// Capacity is the rps that "Nx" rates multiply. Required when a rate is
	// written as a multiple; zero otherwise.
	Capacity float64
	// NumPrompts is each tenant's request count when neither the tenant nor
	// the run has a duration. Default 1000 (vLLM's --num-prompts).
	NumPrompts int
	// Duration overrides the file's duration when > 0.
	Duration time.Duration
	// RateScale multiplies every tenant's rate (sweep). 0 means 1.
	RateScale float64
	// Exclude lists tenants left out (isolation baselines). The others'
	// schedules are unchanged.
	Exclude []string
	// Dataset, when set, supplies prompts and output lengths (custom
	// dataset): each request draws an entry of its tenant (or an untagged
	// one) from its tenant's stream.
	Dataset []Entry
}

// Plan is one tenant with every default resolved.
type Plan struct {
	Index       int
	Name        string
	APIKey      string
	Role        string // victim | aggressor
	Weight      float64
	Priority    int // sent as X-Priority when HasPriority (0 is highest)
	HasPriority bool
	Rate        float64 // peak rps; +Inf = all at t0
	Burstiness  float64 // gamma shape; +Inf = constant interval
	NumPrompts  int
	Input       Length
	Output      Length
	Pattern     Pattern
	RampFrom    float64 // rps, for ramp
	RampTo      float64
	Deadline    time.Duration // 0 = none
	SLO         SLO
	Cancel      *Cancel
	Cost        Cost
}

// Request is one planned request. Times are offsets from t0.
type Request struct {
	Tenant      int // index into Schedule.Tenants
	N           int // per-tenant sequence number, from 0
	At          time.Duration
	InputLen    int
	OutputLen   int
	PromptSeed  uint64 // with a run salt, selects the prompt's token ids
	CancelAfter int    // drop the stream after this many chunks; 0 = never
	Entry       int    // 1-based index into Schedule.Dataset; 0 = random prompt
}

// Schedule is the whole open-loop plan, fixed before t0. It is immutable
// once built and safe for concurrent reads.
type Schedule struct {
	Seed     uint64
	Duration time.Duration // 0 = count-bounded
	Warmup   time.Duration
	Tenants  []Plan
	Requests []Request // sorted by At, then tenant, then N
	Dataset  []Entry   // custom dataset, if any
}

// OfferedRate returns the mean offered rps of tenant i over the schedule
// (count / span); 0 when it sent nothing.
func (s *Schedule) OfferedRate(i int) float64 {
	n := 0
	var last time.Duration
	for _, r := range s.Requests {
		if r.Tenant == i {
			n++
			last = r.At
		}
	}
	span := s.Duration
	if span == 0 {
		span = last
	}
	if n == 0 || span <= 0 {
		return 0
	}
	return float64(n) / span.Seconds()
}

// TenantSeed derives tenant name's PCG seeds from the workload seed:
// FNV-1a 64 of the name, mixed with the seed by SplitMix64. The function is
// part of the file format: changing it changes every schedule.
func TenantSeed(seed uint64, name string) (uint64, uint64) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	a := splitmix(seed ^ h.Sum64())
	return a, splitmix(a ^ 0x9e3779b97f4a7c15)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Gamma draws from Gamma(shape k, scale theta) by Marsaglia–Tsang (2000),
// with the U^(1/k) boost for k < 1.
func Gamma(r *rand.Rand, k, theta float64) float64 {
	if k < 1 {
		u := r.Float64()
		return Gamma(r, k+1, theta) * math.Pow(u, 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v * theta
		}
	}
}

// Draw samples one length (>= 1).
func (l *Length) Draw(r *rand.Rand) int {
	var v int
	switch l.Dist {
	case "fixed":
		v = l.Value
	case "uniform":
		lo := int(math.Floor(l.Mean * (1 - l.RangeRatio)))
		hi := int(math.Ceil(l.Mean * (1 + l.RangeRatio)))
		v = lo + r.IntN(hi-lo+1)
	case "normal":
		v = int(math.Round(l.Mean + l.Stddev*r.NormFloat64()))
	case "lognormal":
		v = int(math.Round(l.Median * math.Exp(l.Sigma*r.NormFloat64())))
	case "empirical":
		if len(l.samples) > 0 {
			v = l.samples[r.IntN(len(l.samples))]
		}
	}
	if l.Min > 0 && v < l.Min {
		v = l.Min
	}
	if l.Max > 0 && v > l.Max {
		v = l.Max
	}
	return max(v, 1)
}

func (l *Length) load() error {
	if l.Dist != "empirical" || l.samples != nil {
		return nil
	}
	f, err := os.Open(l.Path)
	if err != nil {
		return fmt.Errorf("empirical lengths: %w", err)
	}
	defer func() { _ = f.Close() }() // opened read-only: closing cannot lose data
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("empirical lengths %s: bad line %q", l.Path, s)
		}
		l.samples = append(l.samples, n)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("empirical lengths %s: %w", l.Path, err)
	}
	if len(l.samples) == 0 {
		return fmt.Errorf("empirical lengths %s: no values", l.Path)
	}
	return nil
}

func resolveRate(r Rate, o Options, scale float64) (float64, error) {
	v := r.Value
	if r.Multiple {
		if o.Capacity <= 0 {
			return 0, fmt.Errorf("rate %s needs --capacity", r)
		}
		v *= o.Capacity
	}
	return v * scale, nil
}

// Plans validates the spec and resolves each tenant (excluded ones too, so
// indices and names stay stable).
func (s *Spec) Plans(o Options) ([]Plan, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	scale := o.RateScale
	if scale == 0 {
		scale = 1
	}
	np := o.NumPrompts
	if np == 0 {
		np = 1000
	}
	var errs []error
	plans := make([]Plan, len(s.Tenants))
	for i, raw := range s.Tenants {
		t := merged(raw, s.Defaults)
		p := Plan{Index: i, Name: t.Name, APIKey: t.APIKey, Role: t.Role, Weight: 1, Burstiness: 1, NumPrompts: np,
			Cost: Cost{Input: 1, Output: 2}}
		if p.Role == "" {
			p.Role = "victim"
		}
		if t.Weight != nil {
			p.Weight = *t.Weight
		}
		if t.Priority != nil {
			p.Priority, p.HasPriority = *t.Priority, true
		}
		if t.NumPrompts != nil {
			p.NumPrompts = *t.NumPrompts
		}
		var err error
		if t.Rate != nil {
			if p.Rate, err = resolveRate(*t.Rate, o, scale); err != nil {
				errs = append(errs, fmt.Errorf("tenants[%d].rate: %w", i, err))
			}
		}
		if t.Arrival != nil && t.Arrival.Burstiness != nil {
			p.Burstiness = t.Arrival.Burstiness.Value
		}
		for _, x := range []struct {
			name string
			src  *Length
			dst  *Length
		}{{"input", t.Input, &p.Input}, {"output", t.Output, &p.Output}} {
			if x.src == nil {
				errs = append(errs, fmt.Errorf("tenants[%d].%s is required (no default)", i, x.name))
				continue
			}
			*x.dst = *x.src
			if err := x.dst.load(); err != nil {
				errs = append(errs, fmt.Errorf("tenants[%d].%s: %w", i, x.name, err))
			}
		}
		if t.Pattern != nil {
			p.Pattern = *t.Pattern
			if p.Pattern.Type == "ramp" {
				if p.RampFrom, err = resolveRate(*p.Pattern.From, o, scale); err != nil {
					errs = append(errs, fmt.Errorf("tenants[%d].pattern.from: %w", i, err))
				}
				if p.RampTo, err = resolveRate(*p.Pattern.To, o, scale); err != nil {
					errs = append(errs, fmt.Errorf("tenants[%d].pattern.to: %w", i, err))
				}
				p.Rate = max(p.RampFrom, p.RampTo)
			}
		}
		if p.Pattern.Type == "" {
			p.Pattern.Type = "steady"
		}
		if t.Deadline != nil {
			p.Deadline = t.Deadline.D()
		}
		if t.SLO != nil {
			p.SLO = *t.SLO
		}
		if t.Cancel != nil && t.Cancel.Fraction > 0 {
			c := *t.Cancel
			if c.AfterChunks == nil {
				c.AfterChunks = &Length{Dist: "uniform", Mean: 32, RangeRatio: 1}
			}
			p.Cancel = &c
		}
		if t.Cost != nil {
			p.Cost = *t.Cost
		}
		plans[i] = p
	}
	return plans, errors.Join(errs...)
}

// Build validates the spec and draws the whole schedule. Each tenant draws
// from its own PCG stream seeded by [TenantSeed], so adding, removing or
// re-rating one tenant leaves every other tenant's requests identical.
func Build(s *Spec, o Options) (*Schedule, error) {
	plans, err := s.Plans(o)
	if err != nil {
		return nil, err
	}
	dur := s.Duration.D()
	if o.Duration > 0 {
		dur = o.Duration
	}
	sc := &Schedule{Seed: s.Seed, Duration: dur, Warmup: s.Warmup.D(), Tenants: plans, Dataset: o.Dataset}
	for i := range plans {
		if slices.Contains(o.Exclude, plans[i].Name) {
			continue
		}
		var pool []int
		for j, e := range o.Dataset {
			if e.Tenant == "" || e.Tenant == plans[i].Name {
				pool = append(pool, j)
			}
		}
		if len(o.Dataset) > 0 && len(pool) == 0 {
			return nil, fmt.Errorf("dataset has no entry for tenant %q", plans[i].Name)
		}
		sc.Requests = append(sc.Requests, tenantRequests(s.Seed, &plans[i], dur, o.Dataset, pool)...)
	}
	slices.SortStableFunc(sc.Requests, func(a, b Request) int {
		switch {
		case a.At != b.At:
			return cmpInt(int64(a.At), int64(b.At))
		case a.Tenant != b.Tenant:
			return cmpInt(int64(a.Tenant), int64(b.Tenant))
		}
		return cmpInt(int64(a.N), int64(b.N))
	})
	return sc, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// rateAt is the pattern's rate at t as a fraction of the peak.
func (p *Plan) acceptProb(t, dur time.Duration) float64 {
	switch p.Pattern.Type {
	case "on_off":
		cycle := p.Pattern.On + p.Pattern.Off
		pos := (t + p.Pattern.Phase.D()) % cycle.D()
		if pos < p.Pattern.On.D() {
			return 1
		}
		return 0
	case "ramp":
		if dur <= 0 || p.Rate == 0 {
			return 1
		}
		f := float64(t) / float64(dur)
		return (p.RampFrom + (p.RampTo-p.RampFrom)*f) / p.Rate
	}
	return 1
}

// tenantRequests draws one tenant's requests. Every candidate arrival
// consumes the same draws (gap, thinning, lengths, prompt, cancel) whether
// or not it is kept, so the stream stays aligned.
func tenantRequests(seed uint64, p *Plan, dur time.Duration, data []Entry, pool []int) []Request {
	s1, s2 := TenantSeed(seed, p.Name)
	r := rand.New(rand.NewPCG(s1, s2))
	var out []Request
	inf := math.IsInf(p.Rate, 1)
	limitByCount := dur <= 0 || inf
	t := 0.0 // seconds
	for {
		at := time.Duration(t * float64(time.Second))
		if limitByCount && len(out) >= p.NumPrompts || !limitByCount && at >= dur {
			return out
		}
		var gap float64
		switch {
		case inf:
			gap = 0
		case math.IsInf(p.Burstiness, 1):
			gap = 1 / p.Rate
		default:
			gap = Gamma(r, p.Burstiness, 1/(p.Rate*p.Burstiness))
		}
		u := r.Float64()
		req := Request{Tenant: p.Index, N: len(out), At: at, InputLen: p.Input.Draw(r), OutputLen: p.Output.Draw(r),
			PromptSeed: r.Uint64()}
		if len(pool) > 0 {
			j := pool[r.IntN(len(pool))]
			req.Entry, req.InputLen, req.OutputLen = j+1, data[j].InputLen(), data[j].OutputLen
		}
		if p.Cancel != nil {
			cu := r.Float64()
			n := p.Cancel.AfterChunks.Draw(r)
			if cu < p.Cancel.Fraction {
				req.CancelAfter = n
			}
		}
		if u < p.acceptProb(at, dur) {
			out = append(out, req)
		}
		t += gap
	}
}

// VocabBase and VocabSize bound prompt token ids, away from special tokens.
const (
	VocabBase = 100
	VocabSize = 30000
)

// PromptTokens fills a prompt of n token ids chosen by (seed, salt). A new
// salt gives new content with the same length (no prefix-cache reuse).
func PromptTokens(seed, salt uint64, n int) []int {
	r := rand.New(rand.NewPCG(seed, splitmix(salt)))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = VocabBase + r.IntN(VocabSize)
	}
	return ids
}
