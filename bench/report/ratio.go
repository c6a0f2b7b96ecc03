package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Ratio compares B with A over one or more A/B pairs.
type Ratio struct {
	Metric string
	Delta  bool   // B − A (ms) rather than B/A
	Better string // lower | higher
	Median float64
	Min    float64
	Max    float64
	N      int // pairs where both sides had the metric
}

type ratioSpec struct {
	name   string
	path   []string
	delta  bool
	better string
}

var ratioSpecs = []ratioSpec{
	{"request_throughput", []string{"request_throughput"}, false, "higher"},
	{"output_throughput", []string{"output_throughput"}, false, "higher"},
	{"request_goodput", []string{"request_goodput"}, false, "higher"},
	{"slo_attainment", []string{"slo_attainment"}, false, "higher"},
	{"p50_ttft_ms", []string{"median_ttft_ms"}, true, "lower"},
	{"p99_ttft_ms", []string{"p99_ttft_ms"}, true, "lower"},
	{"p50_tpot_ms", []string{"median_tpot_ms"}, true, "lower"},
	{"p50_e2el_ms", []string{"median_e2el_ms"}, true, "lower"},
	{"p99_e2el_ms", []string{"p99_e2el_ms"}, true, "lower"},
	{"victims_p99_ttft", []string{"victims", "p99_ttft_ms"}, false, "lower"},
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Ratios computes B/A (or B − A for latencies) for each pair (A, B) and
// reports the median over pairs with min and max.
func Ratios(pairs [][2]Doc) []Ratio {
	var out []Ratio
	for _, sp := range ratioSpecs {
		var vals []float64
		for _, p := range pairs {
			a, okA := p[0].F(sp.path...)
			b, okB := p[1].F(sp.path...)
			if !okA || !okB {
				continue
			}
			if sp.delta {
				vals = append(vals, b-a)
			} else if a != 0 {
				vals = append(vals, b/a)
			}
		}
		if len(vals) == 0 {
			continue
		}
		out = append(out, Ratio{Metric: sp.name, Delta: sp.delta, Better: sp.better, Median: median(vals),
			Min: slices.Min(vals), Max: slices.Max(vals), N: len(vals)})
	}
	return out
}

func find(rs []Ratio, m string) (Ratio, bool) {
	for _, r := range rs {
		if r.Metric == m {
			return r, true
		}
	}
	return Ratio{}, false
}

// WriteRatios prints the headlines (overhead, protection, shedding) and
// then every ratio. as are the A results and bs the B results.
func WriteRatios(w io.Writer, as, bs []Doc) {
	pairs := make([][2]Doc, 0, min(len(as), len(bs)))
	for i := range min(len(as), len(bs)) {
		pairs = append(pairs, [2]Doc{as[i], bs[i]})
	}
	rs := Ratios(pairs)
	fmt.Fprintf(w, "A/B over %d pair(s): B/A ratios (Δ = B − A in ms), median [min, max]\n", len(pairs))
	attA := 1.0
	for _, a := range as {
		attA = min(attA, f(a, "slo_attainment"))
	}
	t50, ok1 := find(rs, "p50_ttft_ms")
	e50, ok2 := find(rs, "p50_e2el_ms")
	if ok1 && ok2 {
		note := ""
		if attA < 0.99 {
			note = " (A's attainment < 99%: A is saturated; this is not overhead)"
		}
		fmt.Fprintf(w, "Overhead:   Δp50 TTFT %+.1f ms, Δp50 E2EL %+.1f ms%s\n", t50.Median, e50.Median, note)
	}
	var prot []string
	if v, ok := find(rs, "victims_p99_ttft"); ok {
		prot = append(prot, fmt.Sprintf("victims p99 TTFT ×%.2f", v.Median))
	}
	if g, ok := find(rs, "request_goodput"); ok {
		prot = append(prot, fmt.Sprintf("goodput ×%.2f", g.Median))
	}
	if len(prot) > 0 {
		fmt.Fprintf(w, "Protection: %s\n", strings.Join(prot, ", "))
	}
	if len(bs) > 0 {
		fmt.Fprintf(w, "Shedding:   B rejected %s; expired %s\n", reasons(bs[len(bs)-1], "rejected"), reasons(bs[len(bs)-1], "expired"))
	}
	fmt.Fprintf(w, "%-20s %-8s %12s %12s %12s\n", "metric", "better", "median", "min", "max")
	for _, r := range rs {
		name := r.Metric
		if r.Delta {
			name = "Δ" + name
		}
		fmt.Fprintf(w, "%-20s %-8s %12.3f %12.3f %12.3f\n", name, r.Better, r.Median, r.Min, r.Max)
	}
}
