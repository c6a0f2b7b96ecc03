package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// `sluice tune --metrics URL` reads a running Sluice's /metrics over a
// window instead of saved sweep results. What it takes, per tenant, from
// the counters' growth over the window (scheduler/lifecycle/metrics.go):
//
//   - offered: sluice_requests_total, all outcomes;
//   - served in time: sluice_ttft_seconds observations at or below the SLO
//     (linear within the bucket holding it, as histogram_quantile does);
//   - expired: sluice_requests_total{outcome="expired"}, and the queue
//     wait's p99 from sluice_queue_wait_seconds, for the notes;
//   - in flight: sluice_inflight_requests, sampled every second (mean and
//     peak);
//
// and the unqueued latency, the median of sluice_upstream_latency_seconds
// (dispatch to the replica's first byte) over every replica. That is one
// operating point: the served-in-time rate is the service rate only when
// the server is loaded to its knee, so tune it under peak traffic.

// metricsSnap is one scrape of the metric families tune reads.
type metricsSnap map[string]*dto.MetricFamily

func scrapeMetrics(ctx context.Context, url string) (metricsSnap, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: not Prometheus text: %w", url, err)
	}
	if fams["sluice_requests_total"] == nil && fams["sluice_ready"] == nil {
		return nil, fmt.Errorf("GET %s: no sluice_* series: not a Sluice admin /metrics", url)
	}
	return fams, nil
}

// watchMetrics scrapes url every `every` for window and returns the first
// and last scrapes, the time between them and each tenant's in-flight mean
// and peak over every scrape.
func watchMetrics(ctx context.Context, url string, window, every time.Duration) (first, last metricsSnap, elapsed time.Duration, inflight map[string][2]float64, err error) {
	start := time.Now()
	if first, err = scrapeMetrics(ctx, url); err != nil {
		return
	}
	inflight = map[string][2]float64{}
	n := 0.0
	sample := func(s metricsSnap) {
		n++
		for t, v := range gaugeByTenant(s, "sluice_inflight_requests") {
			x := inflight[t]
			inflight[t] = [2]float64{x[0] + v, max(x[1], v)}
		}
	}
	sample(first)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for last = first; time.Since(start) < window; {
		select {
		case <-ctx.Done():
			err = ctx.Err()
			return
		case <-tick.C:
		}
		if last, err = scrapeMetrics(ctx, url); err != nil {
			return
		}
		sample(last)
	}
	elapsed = time.Since(start)
	for t, x := range inflight {
		inflight[t] = [2]float64{x[0] / n, x[1]}
	}
	return
}

// liveRun turns two scrapes elapsed apart into a tuneRun (one operating
// point) and a note per tenant.
func liveRun(url string, first, last metricsSnap, elapsed time.Duration, inflight map[string][2]float64, slo time.Duration) (tuneRun, []string, error) {
	r := tuneRun{path: fmt.Sprintf("%s over %s", url, elapsed.Round(time.Second)), tenants: map[string]tuneTenant{}}
	secs := elapsed.Seconds()
	if secs <= 0 {
		return r, nil, fmt.Errorf("no time between scrapes")
	}
	byTenant := func(s metricsSnap, outcome string) map[string]float64 {
		out := map[string]float64{}
		if f := s["sluice_requests_total"]; f != nil {
			for _, m := range f.GetMetric() {
				if outcome == "" || label(m, "outcome") == outcome {
					out[label(m, "tenant")] += m.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	all0, all1 := byTenant(first, ""), byTenant(last, "")
	exp0, exp1 := byTenant(first, "expired"), byTenant(last, "expired")
	ok0, ok1 := byTenant(first, "ok"), byTenant(last, "ok")
	var notes []string
	names := make([]string, 0, len(all1))
	for t := range all1 {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		offered := (all1[t] - all0[t]) / secs
		if offered <= 0 {
			continue // no traffic in the window: nothing to tune from
		}
		ttft := histDelta(first, last, "sluice_ttft_seconds", "tenant", t)
		wait := histDelta(first, last, "sluice_queue_wait_seconds", "tenant", t)
		inTime := ttft.countAtOrBelow(slo.Seconds()) / secs
		tt := tuneTenant{served: inTime, offered: offered, concurrency: inflight[t][0], maxConcurrent: inflight[t][1]}
		r.tenants[t] = tt
		r.offered += offered
		r.served += inTime
		p99 := "-"
		if q, ok := wait.quantile(0.99); ok {
			p99 = time.Duration(q * float64(time.Second)).Round(time.Millisecond).String()
		}
		notes = append(notes, fmt.Sprintf("tenant %s: %.2f req/s offered, %.2f ok, %.2f within the SLO, %.2f expired; queue wait p99 %s; in flight mean %.1f, peak %.0f",
			t, offered, (ok1[t]-ok0[t])/secs, inTime, (exp1[t]-exp0[t])/secs, p99, tt.concurrency, tt.maxConcurrent))
	}
	if len(r.tenants) == 0 {
		return r, nil, fmt.Errorf("%s: no requests in %s: tune under traffic (--window longer?)", url, elapsed.Round(time.Millisecond))
	}
	r.goodput = r.served
	up := histDelta(first, last, "sluice_upstream_latency_seconds", "", "")
	p50, ok := up.quantile(0.5)
	if !ok {
		return r, nil, fmt.Errorf("%s: nothing was dispatched in %s: no unqueued latency to subtract", url, elapsed.Round(time.Millisecond))
	}
	r.ttftP50 = p50 * 1000
	return r, notes, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func gaugeByTenant(s metricsSnap, name string) map[string]float64 {
	out := map[string]float64{}
	if f := s[name]; f != nil {
		for _, m := range f.GetMetric() {
			out[label(m, "tenant")] += m.GetGauge().GetValue()
		}
	}
	return out
}

// hist is a cumulative histogram: counts at or below each upper bound
// (ascending; the last is +Inf).
type hist struct {
	bounds []float64
	counts []float64
}

// histDelta is the growth of histogram name between two scrapes, summed
// over the series whose label key is val ("" key: every series).
func histDelta(first, last metricsSnap, name, key, val string) hist {
	var h hist
	add := func(s metricsSnap, sign float64) {
		f := s[name]
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			if key != "" && label(m, key) != val {
				continue
			}
			hg := m.GetHistogram()
			bs := hg.GetBucket()
			if h.bounds == nil {
				for _, b := range bs {
					h.bounds = append(h.bounds, b.GetUpperBound())
				}
				h.bounds = append(h.bounds, math.Inf(1))
				h.counts = make([]float64, len(h.bounds))
			}
			if len(bs)+1 != len(h.bounds) {
				continue // other buckets: not a series this version wrote
			}
			for i, b := range bs {
				h.counts[i] += sign * float64(b.GetCumulativeCount())
			}
			h.counts[len(bs)] += sign * float64(hg.GetSampleCount())
		}
	}
	add(last, 1)
	add(first, -1)
	return h
}

func (h hist) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// countAtOrBelow is the observations at or below x, linear within the
// bucket that holds x (from 0 below the first bound).
func (h hist) countAtOrBelow(x float64) float64 {
	lo, below := 0.0, 0.0
	for i, ub := range h.bounds {
		if x < ub {
			if math.IsInf(ub, 1) {
				return below // beyond the last finite bound: no shape to interpolate
			}
			return below + (h.counts[i]-below)*(x-lo)/(ub-lo)
		}
		lo, below = ub, h.counts[i]
	}
	return below
}

// quantile is histogram_quantile: linear within the bucket holding rank
// q·total; false when empty.
func (h hist) quantile(q float64) (float64, bool) {
	n := h.total()
	if n <= 0 {
		return 0, false
	}
	rank := q * n
	lo, below := 0.0, 0.0
	for i, ub := range h.bounds {
		if h.counts[i] >= rank {
			if math.IsInf(ub, 1) {
				return lo, true // the highest finite bound, as Prometheus answers
			}
			if h.counts[i] == below {
				return ub, true
			}
			return lo + (ub-lo)*(rank-below)/(h.counts[i]-below), true
		}
		lo, below = ub, h.counts[i]
	}
	return lo, true
}

// metricsURL accepts the admin listener's address in any of the usual
// forms: host:port, http://host:port or the full /metrics URL.
func metricsURL(s string) string {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	if !strings.HasSuffix(strings.TrimRight(s, "/"), "/metrics") {
		s = strings.TrimRight(s, "/") + "/metrics"
	}
	return s
}
