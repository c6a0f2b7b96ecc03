package views

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// What the status page shows beyond the instantaneous state: rates, TTFT
// and queue-wait percentiles over the last minute, peaks since the start,
// the last refusals, and how long each replica has been in its state. The
// server samples its own counters once a second into an [OpsSampler]; the
// report compares the newest sample with older ones.

const (
	opsSamples    = 61               // one a second: a minute of history
	opsRateWindow = 10 * time.Second // req/s and tok/s
	opsPctWindow  = time.Minute      // TTFT and queue-wait percentiles
	recentMax     = 20               // refusals kept for the page
)

// OpsSample is one second's cumulative counters per tenant and each
// replica's state, as the server reads them.
type OpsSample struct {
	At       time.Time
	Usage    UsageIn // the usage counters since the start: requests and tokens settled
	Tenants  map[string]TenantSample
	Replicas map[string]string // replica → state
}

// TenantSample is a tenant's cumulative counters and its instantaneous
// queue depth and in-flight count. Record sets Requests and Tokens (input
// + output) from the sample's Usage.
type TenantSample struct {
	Requests, Tokens int64
	TTFT, Wait       Hist
	Queued, Inflight int64
}

// Hist is a histogram's cumulative bucket counts (upper bounds in Bounds)
// and count.
type Hist struct {
	Bounds []float64
	Cum    []uint64
	Count  uint64
}

// HistOf reads tenant's child of a histogram vector.
func HistOf(v *prometheus.HistogramVec, tenant string) Hist {
	var m dto.Metric
	if err := v.WithLabelValues(tenant).(prometheus.Metric).Write(&m); err != nil || m.Histogram == nil {
		return Hist{}
	}
	h := Hist{Count: m.Histogram.GetSampleCount()}
	for _, b := range m.Histogram.GetBucket() {
		h.Bounds = append(h.Bounds, b.GetUpperBound())
		h.Cum = append(h.Cum, b.GetCumulativeCount())
	}
	return h
}

// peak is a tenant's highest queue depth and in-flight count sampled since
// the process started.
type peak struct{ queued, inflight int64 }

// repState is a replica's state and when this process saw it change.
type repState struct {
	state string
	since time.Time
}

// OpsSampler keeps the samples; the zero value is ready and it is safe
// for concurrent use.
type OpsSampler struct {
	mu      sync.Mutex
	samples []OpsSample // oldest first, at most opsSamples, without Usage and Replicas
	peaks   map[string]peak
	reps    map[string]repState
}

// Record adds one sample, which it keeps (its maps included). started is
// the process start: a replica's first state is dated from it (the first
// sample is within a second of it).
func (o *OpsSampler) Record(smp OpsSample, started time.Time) {
	idx := func(name string) int { return slices.Index(smp.Usage.Dims, name) }
	if req, in, out := idx("requests"), idx("input_tokens"), idx("output_tokens"); min(req, in, out) >= 0 {
		for _, c := range smp.Usage.Counts {
			if t, ok := smp.Tenants[c.Tenant]; ok {
				t.Requests, t.Tokens = t.Requests+c.Values[req], t.Tokens+c.Values[in]+c.Values[out]
				smp.Tenants[c.Tenant] = t
			}
		}
	}
	smp.Usage = UsageIn{}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.peaks == nil {
		o.peaks, o.reps = map[string]peak{}, map[string]repState{}
	}
	for name, t := range smp.Tenants {
		p := o.peaks[name]
		p.queued, p.inflight = max(p.queued, t.Queued), max(p.inflight, t.Inflight)
		o.peaks[name] = p
	}
	for name, st := range smp.Replicas {
		if prev, ok := o.reps[name]; !ok || prev.state != st {
			since := smp.At
			if !ok {
				since = started
			}
			o.reps[name] = repState{state: st, since: since}
		}
	}
	smp.Replicas = nil
	o.samples = append(o.samples, smp)
	if len(o.samples) > opsSamples {
		o.samples = append(o.samples[:0], o.samples[len(o.samples)-opsSamples:]...)
	}
}

// Ops is a copy of an [OpsSampler]'s samples, for one report.
type Ops struct {
	samples []OpsSample
	peaks   map[string]peak
	reps    map[string]repState
}

// Snapshot copies the samples (each sample's maps are never written once
// recorded, so they are shared).
func (o *OpsSampler) Snapshot() Ops {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Ops{samples: slices.Clone(o.samples), peaks: maps.Clone(o.peaks), reps: maps.Clone(o.reps)}
}

// quantile estimates the q-quantile of the observations between old and
// cur (cur - old), interpolating linearly inside a bucket as Prometheus's
// histogram_quantile does; NaN without observations. An observation above
// the last bucket counts as the last bound.
func quantile(q float64, cur, old Hist) float64 {
	n := cur.Count - old.Count
	if n == 0 || len(cur.Cum) == 0 {
		return math.NaN()
	}
	at := func(h Hist, i int) uint64 {
		if i < len(h.Cum) {
			return h.Cum[i]
		}
		return 0
	}
	rank := q * float64(n)
	lower, prev := 0.0, uint64(0)
	for i, ub := range cur.Bounds {
		c := cur.Cum[i] - at(old, i)
		if float64(c) >= rank {
			inBucket := c - prev
			if inBucket == 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-float64(prev))/float64(inBucket)
		}
		lower, prev = ub, c
	}
	return cur.Bounds[len(cur.Bounds)-1]
}

// TenantOps are a tenant's rates, percentiles and peaks on the page.
type TenantOps struct {
	ReqPerSec  float64 `json:"req_per_s"`
	TokPerSec  float64 `json:"tok_per_s"` // input + output tokens settled
	TTFTP50ms  *int64  `json:"ttft_p50_ms"`
	TTFTP99ms  *int64  `json:"ttft_p99_ms"`
	WaitP50ms  *int64  `json:"queue_wait_p50_ms"`
	WaitP99ms  *int64  `json:"queue_wait_p99_ms"`
	PeakQueued int64   `json:"queued_peak"`
	PeakFlight int64   `json:"inflight_peak"`
}

// Tenant computes a tenant's TenantOps from the samples.
func (o Ops) Tenant(name string) TenantOps {
	out := TenantOps{PeakQueued: o.peaks[name].queued, PeakFlight: o.peaks[name].inflight}
	if len(o.samples) < 2 {
		return out
	}
	cur := o.samples[len(o.samples)-1]
	since := func(d time.Duration) OpsSample {
		for _, smp := range o.samples {
			if cur.At.Sub(smp.At) <= d {
				return smp
			}
		}
		return o.samples[0]
	}
	rs := since(opsRateWindow)
	if dt := cur.At.Sub(rs.At).Seconds(); dt > 0 {
		out.ReqPerSec = round2(float64(cur.Tenants[name].Requests-rs.Tenants[name].Requests) / dt)
		out.TokPerSec = round2(float64(cur.Tenants[name].Tokens-rs.Tenants[name].Tokens) / dt)
	}
	ps := since(opsPctWindow)
	ms := func(v float64) *int64 {
		if math.IsNaN(v) {
			return nil
		}
		x := int64(math.Round(v * 1000))
		return &x
	}
	c, p := cur.Tenants[name], ps.Tenants[name]
	out.TTFTP50ms, out.TTFTP99ms = ms(quantile(0.5, c.TTFT, p.TTFT)), ms(quantile(0.99, c.TTFT, p.TTFT))
	out.WaitP50ms, out.WaitP99ms = ms(quantile(0.5, c.Wait, p.Wait)), ms(quantile(0.99, c.Wait, p.Wait))
	return out
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// ReplicaSince is when this process saw the replica enter its state.
func (o Ops) ReplicaSince(name string) (time.Time, bool) {
	r, ok := o.reps[name]
	return r.since, ok
}

// Refusal is one refused request on the page.
type Refusal struct {
	At      time.Time `json:"at"`
	Tenant  string    `json:"tenant"`
	Status  int       `json:"status"`
	Code    string    `json:"code"`
	Message string    `json:"message"`
}

// RefusalLog keeps the last recentMax refusals; the zero value is ready.
type RefusalLog struct {
	mu   sync.Mutex
	ring [recentMax]Refusal
	n    int // refusals recorded in all
}

// Add records a refusal.
func (l *RefusalLog) Add(r Refusal) {
	l.mu.Lock()
	l.ring[l.n%recentMax] = r
	l.n++
	l.mu.Unlock()
}

// Recent returns the kept refusals, newest first.
func (l *RefusalLog) Recent() []Refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []Refusal{}
	for i := l.n - 1; i >= 0 && i >= l.n-recentMax; i-- {
		out = append(out, l.ring[i%recentMax])
	}
	return out
}
