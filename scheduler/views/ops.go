package scheduler

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// What the status page shows beyond the instantaneous state: rates, TTFT
// and queue-wait percentiles over the last minute, peaks since the start,
// the last refusals, and how long each replica has been in its state. The
// server samples its own counters once a second (readyLoop); the report
// compares the newest sample with older ones.

const (
	opsSamples    = 61               // one a second: a minute of history
	opsRateWindow = 10 * time.Second // req/s and tok/s
	opsPctWindow  = time.Minute      // TTFT and queue-wait percentiles
	recentMax     = 20               // refusals kept for the page
)

// opsSample is one second's cumulative counters per tenant.
type opsSample struct {
	at      time.Time
	tenants map[string]tenantSample
}

type tenantSample struct {
	requests, tokens int64
	ttft, wait       histSample
}

// histSample is a histogram's cumulative bucket counts (upper bounds in
// bounds) and count.
type histSample struct {
	bounds []float64
	cum    []uint64
	count  uint64
}

// peak is a tenant's highest queue depth and in-flight count sampled since
// the process started.
type peak struct{ queued, inflight int64 }

// repState is a replica's state and when this process saw it change.
type repState struct {
	state string
	since time.Time
}

// opsSampler keeps the samples; safe for concurrent use.
type opsSampler struct {
	mu      sync.Mutex
	samples []opsSample // oldest first, at most opsSamples
	peaks   map[string]peak
	reps    map[string]repState
}

// sampleOps records one sample (readyLoop, once a second).
func (s *Server) sampleOps(now time.Time) {
	pol := s.pol.Load()
	tokens := map[string]int64{}
	requests := map[string]int64{}
	s.usage.Range(func(k, v any) bool {
		uk, uc := k.(usageKey), v.(*usageCounters)
		uc.mu.Lock()
		requests[uk.tenant] += uc.total[0]
		tokens[uk.tenant] += uc.total[1] + uc.total[2] // input + output
		uc.mu.Unlock()
		return true
	})
	smp := opsSample{at: now, tenants: make(map[string]tenantSample, len(pol.Order))}
	o := &s.ops
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.peaks == nil {
		o.peaks, o.reps = map[string]peak{}, map[string]repState{}
	}
	for _, t := range pol.Order {
		smp.tenants[t.Name] = tenantSample{requests: requests[t.Name], tokens: tokens[t.Name],
			ttft: histOf(s.m.TTFT, t.Name), wait: histOf(s.m.QueueWait, t.Name)}
		p := o.peaks[t.Name]
		q := int64(0)
		if qs, ok := s.q.Stats(t.Name); ok {
			q = int64(qs.Depth)
		}
		p.queued, p.inflight = max(p.queued, q), max(p.inflight, t.RT.Inflight.Load())
		o.peaks[t.Name] = p
	}
	snap := s.gpu.Snapshot()
	for _, r := range s.reps.List() {
		st := "unknown"
		if v, ok := snap.Replica(r.Name); ok {
			st = v.State.String()
		}
		if prev, ok := o.reps[r.Name]; !ok || prev.state != st {
			since := now
			if !ok {
				since = s.started // first sample, within a second of the start
			}
			o.reps[r.Name] = repState{state: st, since: since}
		}
	}
	o.samples = append(o.samples, smp)
	if len(o.samples) > opsSamples {
		o.samples = append(o.samples[:0], o.samples[len(o.samples)-opsSamples:]...)
	}
}

// histOf reads tenant's child of a histogram vector.
func histOf(v *prometheus.HistogramVec, tenant string) histSample {
	var m dto.Metric
	if err := v.WithLabelValues(tenant).(prometheus.Metric).Write(&m); err != nil || m.Histogram == nil {
		return histSample{}
	}
	h := histSample{count: m.Histogram.GetSampleCount()}
	for _, b := range m.Histogram.GetBucket() {
		h.bounds = append(h.bounds, b.GetUpperBound())
		h.cum = append(h.cum, b.GetCumulativeCount())
	}
	return h
}

// quantile estimates the q-quantile of the observations between old and
// cur (cur - old), interpolating linearly inside a bucket as Prometheus's
// histogram_quantile does; NaN without observations. An observation above
// the last bucket counts as the last bound.
func quantile(q float64, cur, old histSample) float64 {
	n := cur.count - old.count
	if n == 0 || len(cur.cum) == 0 {
		return math.NaN()
	}
	at := func(h histSample, i int) uint64 {
		if i < len(h.cum) {
			return h.cum[i]
		}
		return 0
	}
	rank := q * float64(n)
	lower, prev := 0.0, uint64(0)
	for i, ub := range cur.bounds {
		c := cur.cum[i] - at(old, i)
		if float64(c) >= rank {
			inBucket := c - prev
			if inBucket == 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-float64(prev))/float64(inBucket)
		}
		lower, prev = ub, c
	}
	return cur.bounds[len(cur.bounds)-1]
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

// tenantOps computes a tenant's TenantOps from the samples.
func (s *Server) tenantOps(name string) TenantOps {
	o := &s.ops
	o.mu.Lock()
	defer o.mu.Unlock()
	out := TenantOps{PeakQueued: o.peaks[name].queued, PeakFlight: o.peaks[name].inflight}
	if len(o.samples) < 2 {
		return out
	}
	cur := o.samples[len(o.samples)-1]
	since := func(d time.Duration) opsSample {
		for _, smp := range o.samples {
			if cur.at.Sub(smp.at) <= d {
				return smp
			}
		}
		return o.samples[0]
	}
	rs := since(opsRateWindow)
	if dt := cur.at.Sub(rs.at).Seconds(); dt > 0 {
		out.ReqPerSec = round2(float64(cur.tenants[name].requests-rs.tenants[name].requests) / dt)
		out.TokPerSec = round2(float64(cur.tenants[name].tokens-rs.tenants[name].tokens) / dt)
	}
	ps := since(opsPctWindow)
	ms := func(v float64) *int64 {
		if math.IsNaN(v) {
			return nil
		}
		x := int64(math.Round(v * 1000))
		return &x
	}
	c, p := cur.tenants[name], ps.tenants[name]
	out.TTFTP50ms, out.TTFTP99ms = ms(quantile(0.5, c.ttft, p.ttft)), ms(quantile(0.99, c.ttft, p.ttft))
	out.WaitP50ms, out.WaitP99ms = ms(quantile(0.5, c.wait, p.wait)), ms(quantile(0.99, c.wait, p.wait))
	return out
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// replicaSince is when this process saw the replica enter its state.
func (s *Server) replicaSince(name string) (time.Time, bool) {
	s.ops.mu.Lock()
	defer s.ops.mu.Unlock()
	r, ok := s.ops.reps[name]
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

// refusalLog keeps the last recentMax refusals; the zero value is ready.
type refusalLog struct {
	mu   sync.Mutex
	ring [recentMax]Refusal
	n    int // refusals recorded in all
}

func (l *refusalLog) add(r Refusal) {
	l.mu.Lock()
	l.ring[l.n%recentMax] = r
	l.n++
	l.mu.Unlock()
}

// recent returns the kept refusals, newest first.
func (l *refusalLog) recent() []Refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []Refusal{}
	for i := l.n - 1; i >= 0 && i >= l.n-recentMax; i-- {
		out = append(out, l.ring[i%recentMax])
	}
	return out
}
