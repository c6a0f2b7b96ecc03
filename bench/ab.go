package bench

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bench/report"
	"github.com/sluicehq/sluice/bench/workload"
)

// ABOptions configures an A/B comparison: one schedule, run against A
// (replicas direct, round-robin) and B (Sluice).
type ABOptions struct {
	Options
	// A are the replicas' base URLs. Required.
	A []string
	// B is Sluice's base URL. Required (Options.BaseURL is ignored).
	B string
	// Order is "ABBA" (default: pairs alternate AB, BA, …) or "AB".
	Order string
	// Repeat is the number of A/B pairs. Default 1.
	Repeat int
	// Settle is the wait after the replicas are idle, before each run.
	// Default 30s.
	Settle time.Duration
	// IdleTimeout bounds the wait for the replicas to go idle. Default 5m.
	IdleTimeout time.Duration
	// SkipIdleWait skips polling /metrics (replicas without metrics).
	SkipIdleWait bool
	// ReplicaMaxNumSeqs is the replicas' --max-num-seqs, for the warning
	// when A's peak in flight is far above it (A then measures vLLM's
	// queue). 0: unknown, no check.
	ReplicaMaxNumSeqs int
}

// ABResult holds every run and the B/A ratios over pairs.
type ABResult struct {
	A, B     []report.Doc
	Ratios   []report.Ratio
	Warnings []string
}

// abWarnings compares A and B beyond the ratios: chunks per token over 10 %
// apart (a hop buffers SSE) and A's peak in flight far above the replicas'
// max-num-seqs.
func abWarnings(r *ABResult, replicas, maxSeqs int) []string {
	cpt := func(ds []report.Doc) float64 {
		var c, n float64
		for _, d := range ds {
			x, _ := d.F("total_chunks")
			y, _ := d.F("total_output_tokens")
			c, n = c+x, n+y
		}
		if n == 0 {
			return 0
		}
		return c / n
	}
	var w []string
	a, b := cpt(r.A), cpt(r.B)
	if a > 0 && b > 0 && math.Abs(b-a)/a > 0.1 {
		w = append(w, fmt.Sprintf("chunks per token differ: A %.3f, B %.3f (a hop buffers or re-chunks SSE)", a, b))
	}
	if maxSeqs > 0 && replicas > 0 {
		for i, d := range r.A {
			peak, _ := d.F("max_concurrent_requests")
			if peak/float64(replicas) > 1.5*float64(maxSeqs) {
				w = append(w, fmt.Sprintf("A run %d: peak %.0f in flight over %d replicas is far above max-num-seqs %d: A measures vLLM's queue",
					i, peak, replicas, maxSeqs))
			}
		}
	}
	return w
}

// AB runs the A/B comparison. Before each run it salts the prompts (same
// lengths and times, new content, so no run hits the previous run's prefix
// cache), waits until the A replicas report no running or waiting requests,
// then waits Settle.
func AB(ctx context.Context, o ABOptions) (*ABResult, error) {
	o.defaults()
	if err := makeOutputDirs(&o.Options); err != nil {
		return nil, err
	}
	if len(o.A) == 0 || o.B == "" {
		return nil, usage("ab needs --a URL[,URL…] and --b URL")
	}
	if o.Order == "" {
		o.Order = "ABBA"
	}
	if o.Order != "ABBA" && o.Order != "AB" {
		return nil, usage("--order must be ABBA or AB")
	}
	if o.Repeat <= 0 {
		o.Repeat = 1
	}
	if o.Settle == 0 {
		o.Settle = 30 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	sched, err := BuildSchedule(o.Options)
	if err != nil {
		return nil, err
	}
	printHeader(&o.Options, sched)
	client := defaultClient(&o.Options)
	out := &ABResult{}
	var sections []report.Section
	var last *Result
	run := 0
	for pair := range o.Repeat {
		seq := "AB"
		if o.Order == "ABBA" && pair%2 == 1 {
			seq = "BA"
		}
		for _, side := range seq {
			if !o.SkipIdleWait {
				if err := waitIdle(ctx, client, o.A, o.IdleTimeout); err != nil {
					return out, err
				}
			}
			if err := sleepCtx(ctx, o.Settle); err != nil {
				return out, err
			}
			ro := o.Options
			ro.Label, ro.RunIndex, ro.Salt = string(side), run, uint64(run)+1
			targets := o.A
			if side == 'B' {
				targets = []string{o.B}
			}
			res, err := execute(ctx, &ro, sched, targets, client)
			if res == nil {
				return out, err
			}
			o.Model = ro.Model
			fmt.Fprintf(o.Stdout, "\n### run %d: %c (pair %d)\n", run, side, pair)
			report.WriteText(o.Stdout, res.Doc, o.PercentileMetrics)
			sections = append(sections, report.RunSection(fmt.Sprintf("run %d: %c (pair %d)", run, side, pair), res.Doc, o.PercentileMetrics))
			if side == 'A' {
				out.A = append(out.A, res.Doc)
			} else {
				out.B = append(out.B, res.Doc)
			}
			last = res
			run++
			if err != nil {
				return out, err
			}
		}
	}
	out.Warnings = abWarnings(out, len(o.A), o.ReplicaMaxNumSeqs)
	var rb strings.Builder
	report.WriteRatios(&rb, out.A, out.B)
	for _, w := range out.Warnings {
		fmt.Fprintf(&rb, "WARNING: %s\n", w)
	}
	fmt.Fprintf(o.Stdout, "\n%s", rb.String())
	pairs := make([][2]report.Doc, 0, len(out.A))
	for i := range min(len(out.A), len(out.B)) {
		pairs = append(pairs, [2]report.Doc{out.A[i], out.B[i]})
	}
	out.Ratios = report.Ratios(pairs)
	sections = append([]report.Section{{Heading: "A/B ratios", Text: rb.String()}}, sections...)
	docs := append(append([]report.Doc{}, out.A...), out.B...)
	return out, writeOutputs(&o.Options, last, sections, docs, "sluice bench ab")
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitIdle polls each replica's /metrics until vllm:num_requests_running
// and vllm:num_requests_waiting are 0.
func waitIdle(ctx context.Context, client *http.Client, replicas []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		busy := 0.0
		for _, r := range replicas {
			n, err := queueLen(ctx, client, r)
			if err != nil {
				return err
			}
			busy += n
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicas still busy after %v (%g running+waiting)", timeout, busy)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

func queueLen(ctx context.Context, client *http.Client, base string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("metrics %s: %w", base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("metrics %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics %s: status %d", base, resp.StatusCode)
	}
	var total float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "vllm:num_requests_running") && !strings.HasPrefix(l, "vllm:num_requests_waiting") {
			continue
		}
		fields := strings.Fields(l)
		if len(fields) < 2 {
			continue
		}
		// The value follows the labels: the last field, or the one before a timestamp.
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if len(fields) >= 3 {
			if v2, err2 := strconv.ParseFloat(fields[len(fields)-2], 64); err2 == nil && !strings.HasSuffix(fields[len(fields)-2], "}") {
				v, err = v2, nil
			}
		}
		if err == nil {
			total += v
		}
	}
	return total, sc.Err()
}

// SweepOptions runs one schedule per total rate.
type SweepOptions struct {
	Options
	// Rates are total request rates (rps); tenant shares are kept.
	Rates []float64
}

// SweepResult holds one result per rate and the knee.
type SweepResult struct {
	Rates []float64
	Docs  []report.Doc
	Knee  int // index of the highest goodput
	// Saturated: some rate's goodput fell below SaturatedBelow of it, so
	// Knee is a knee; otherwise it is only the best rate tried.
	Saturated bool
}

// SaturatedBelow: a run whose goodput is less than this share of its
// offered rate was past the knee.
const SaturatedBelow = 0.95

// baseRate is the total finite rate of the schedule at scale 1.
func baseRate(o Options) (float64, error) {
	s, err := o.Spec()
	if err != nil {
		return 0, err
	}
	plans, err := s.Plans(workload.Options{Capacity: o.Capacity, NumPrompts: o.NumPrompts})
	if err != nil {
		return 0, usage("workload: %v", err)
	}
	var total float64
	for _, p := range plans {
		if p.Rate > 0 && p.Rate < 1e300 {
			total += p.Rate
		}
	}
	if total == 0 {
		return 0, usage("sweep needs finite rates")
	}
	return total, nil
}

// Sweep scales every tenant's rate to each total in Rates (shares kept) and
// reports the knee: the rate with the highest goodput, with p99 TTFT there.
func Sweep(ctx context.Context, o SweepOptions) (*SweepResult, error) {
	o.defaults()
	if err := makeOutputDirs(&o.Options); err != nil {
		return nil, err
	}
	if len(o.Rates) == 0 {
		return nil, usage("sweep needs --rates")
	}
	if o.Workload == "" {
		// The flags' one tenant: --rates sets each run's total, so its
		// base rate is only the unit the scale applies to.
		o.RequestRate = "1"
	}
	base, err := baseRate(o.Options)
	if err != nil {
		return nil, err
	}
	out := &SweepResult{}
	var last *Result
	err = withSims(ctx, &o.Options, func(ctx context.Context, urls []string) error {
		client := defaultClient(&o.Options)
		for i, rate := range o.Rates {
			ro := o.Options
			ro.RateScale = rate / base
			ro.RequestRate = strconv.FormatFloat(rate, 'g', -1, 64)
			ro.Label, ro.RunIndex, ro.Salt = fmt.Sprintf("rate%g", rate), i, uint64(i)+1
			sched, err := BuildSchedule(ro)
			if err != nil {
				return err
			}
			res, err := execute(ctx, &ro, sched, urls, client)
			if res == nil {
				return err
			}
			o.Model = ro.Model
			fmt.Fprintf(o.Stdout, "\n### rate %g rps\n", rate)
			report.WriteText(o.Stdout, res.Doc, o.PercentileMetrics)
			out.Rates = append(out.Rates, rate)
			out.Docs = append(out.Docs, res.Doc)
			last = res
			if err != nil {
				return err
			}
		}
		return nil
	})
	if len(out.Docs) == 0 {
		return out, err
	}
	gp := map[string][]float64{"goodput (req/s)": nil}
	p99 := map[string][]float64{"p99 TTFT (ms)": nil}
	fmt.Fprintf(o.Stdout, "\n%-10s %10s %10s %8s %12s\n", "rate", "req/s", "goodput", "attain", "p99 TTFT ms")
	for i, d := range out.Docs {
		g, _ := d.F("request_goodput")
		t, _ := d.F("p99_ttft_ms")
		rt, _ := d.F("request_throughput")
		at, _ := d.F("slo_attainment")
		gp["goodput (req/s)"] = append(gp["goodput (req/s)"], g)
		p99["p99 TTFT (ms)"] = append(p99["p99 TTFT (ms)"], t)
		if g > gp["goodput (req/s)"][out.Knee] {
			out.Knee = i
		}
		fmt.Fprintf(o.Stdout, "%-10g %10.2f %10.2f %7.1f%% %12.0f\n", out.Rates[i], rt, g, 100*at, t)
	}
	kt, _ := out.Docs[out.Knee].F("p99_ttft_ms")
	// A knee is where more offered load stops being served in time; when
	// every rate was (nearly) all served, the sweep never reached it.
	sent := make([]float64, len(out.Docs))
	for i, d := range out.Docs {
		sent[i], _ = d.F("schedule", "sent_rate")
	}
	out.Saturated = saturated(out.Rates, gp["goodput (req/s)"], sent)
	if out.Saturated {
		fmt.Fprintf(o.Stdout, "Knee: %g rps (goodput %.2f req/s, p99 TTFT %.0f ms)\n", out.Rates[out.Knee], gp["goodput (req/s)"][out.Knee], kt)
	} else {
		// Nothing saturated: the capacity is above the highest rate tried,
		// whichever rate's goodput happened to measure highest.
		hi := 0
		for i, r := range out.Rates {
			if r > out.Rates[hi] {
				hi = i
			}
		}
		ht, _ := out.Docs[hi].F("p99_ttft_ms")
		fmt.Fprintf(o.Stdout, "No knee: every rate's goodput was at least %.0f%% of it; capacity is above %g rps (goodput %.2f req/s, p99 TTFT %.0f ms): sweep higher rates\n",
			100*SaturatedBelow, out.Rates[hi], gp["goodput (req/s)"][hi], ht)
	}
	sections := []report.Section{{Heading: "Sweep", SVGs: []string{
		report.LineChart("Goodput vs rate", "offered rate (rps)", "goodput (req/s)", out.Rates, gp, []string{"goodput (req/s)"}),
		report.LineChart("p99 TTFT vs rate", "offered rate (rps)", "p99 TTFT (ms)", out.Rates, p99, []string{"p99 TTFT (ms)"}),
	}}}
	for i, d := range out.Docs {
		sections = append(sections, report.RunSection(fmt.Sprintf("rate %g rps", out.Rates[i]), d, o.PercentileMetrics))
	}
	if werr := writeOutputs(&o.Options, last, sections, out.Docs, "sluice bench sweep"); werr != nil && err == nil {
		err = werr
	}
	return out, err
}

// saturated reports whether any rate's goodput fell below SaturatedBelow
// of what was offered: the rate, or what a lagging generator really sent
// (sent[i] > 0).
func saturated(rates, goodput, sent []float64) bool {
	for i, g := range goodput {
		offered := rates[i]
		if sent[i] > 0 {
			offered = min(offered, sent[i])
		}
		if g < SaturatedBelow*offered {
			return true
		}
	}
	return false
}
