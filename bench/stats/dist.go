// Package stats turns per-request records into vLLM-compatible serving
// metrics, per-tenant tables and fairness figures (BENCH.md §5–6).
//
// Formulas follow `vllm bench serve` exactly: only successful requests feed
// latency distributions and token totals; TPOT excludes the first token and
// exists only for outputs longer than one token; percentiles of TTFT, TPOT
// and E2EL use numpy's linear method on exact samples; empty distributions
// report 0 (vLLM's `np.mean(x or 0)`). ITL is pooled over all requests
// into an HDR histogram (1 µs–10 min, 3 significant digits); its mean and
// standard deviation stay exact.
package stats

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Dist summarises a latency distribution in milliseconds. P is keyed by
// the vLLM percentile word ("99", "99.9").
type Dist struct {
	Mean   float64
	Median float64
	Std    float64
	P      map[string]float64
	N      int
}

// PWord renders a percentile as vLLM names it in result keys.
func PWord(p float64) string {
	if p == math.Trunc(p) {
		return strconv.Itoa(int(p))
	}
	return strconv.FormatFloat(p, 'f', -1, 64)
}

// Percentile is numpy's default (linear) percentile of sorted values:
// the value at rank p/100·(n−1), interpolated. Empty input gives 0.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	switch n {
	case 0:
		return 0
	case 1:
		return sorted[0]
	}
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	if lo >= n-1 {
		return sorted[n-1]
	}
	f := rank - float64(lo)
	return sorted[lo] + (sorted[lo+1]-sorted[lo])*f
}

// NewDist computes an exact distribution of samples (ms); it sorts a copy.
func NewDist(samples []float64, ps []float64) Dist {
	s := slices.Clone(samples)
	slices.Sort(s)
	d := Dist{P: map[string]float64{}, N: len(s)}
	if len(s) > 0 {
		var sum float64
		for _, v := range s {
			sum += v
		}
		d.Mean = sum / float64(len(s))
		var sq float64
		for _, v := range s {
			sq += (v - d.Mean) * (v - d.Mean)
		}
		d.Std = math.Sqrt(sq / float64(len(s)))
	}
	d.Median = Percentile(s, 50)
	for _, p := range ps {
		d.P[PWord(p)] = Percentile(s, p)
	}
	return d
}

// HDR bounds for ITL, in microseconds.
const (
	hdrMinUS = 1
	hdrMaxUS = int64(10 * time.Minute / time.Microsecond)
	hdrSig   = 3
)

// ITLHist accumulates inter-token latencies: percentiles from an HDR
// histogram, mean and std exact. Not safe for concurrent use.
type ITLHist struct {
	h          *hdrhistogram.Histogram
	n          int
	sum, sumSq float64 // ms
}

// NewITLHist returns an empty histogram.
func NewITLHist() *ITLHist { return &ITLHist{h: hdrhistogram.New(hdrMinUS, hdrMaxUS, hdrSig)} }

// Record adds one gap.
func (x *ITLHist) Record(d time.Duration) {
	us := min(max(int64(d/time.Microsecond), hdrMinUS), hdrMaxUS)
	_ = x.h.RecordValue(us)
	ms := float64(d) / 1e6
	x.n++
	x.sum += ms
	x.sumSq += ms * ms
}

// Dist returns the distribution in ms. Percentiles are HDR values (within
// 0.1 %); an empty histogram gives zeros.
func (x *ITLHist) Dist(ps []float64) Dist {
	d := Dist{P: map[string]float64{}, N: x.n}
	if x.n == 0 {
		for _, p := range ps {
			d.P[PWord(p)] = 0
		}
		return d
	}
	d.Mean = x.sum / float64(x.n)
	d.Std = math.Sqrt(max(x.sumSq/float64(x.n)-d.Mean*d.Mean, 0))
	q := func(p float64) float64 { return float64(x.h.ValueAtQuantile(p)) / 1000 }
	d.Median = q(50)
	for _, p := range ps {
		d.P[PWord(p)] = q(p)
	}
	return d
}
