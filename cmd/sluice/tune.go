package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bench/report"
	"github.com/sluicehq/sluice/scheduler/config"
)

// tuneRun is one saved result as tune reads it.
type tuneRun struct {
	path    string
	offered float64 // sent requests/s
	served  float64 // completed requests/s
	goodput float64
	ttftP50 float64 // ms
	tenants map[string]tuneTenant
}

type tuneTenant struct {
	served, offered float64 // requests/s
	concurrency     float64 // mean requests in flight
	maxConcurrent   float64
}

// tuneRec is one tenant's recommendation.
type tuneRec struct {
	name        string
	maxWait     time.Duration
	maxDepth    int
	concurrency int
	why         [3]string
}

// runTune implements `sluice tune`.
func runTune(ctx context.Context, e env, args []string) error {
	fs := newFlags("tune")
	slo := fs.Duration("slo-ttft", 2*time.Second, "time-to-first-token SLO the queue wait must fit")
	limit := fs.Bool("limit", false, "also recommend a per-tenant concurrency limit (none by default)")
	cfgPath := fs.String("config", "", "apply the snippet to this config and check the result")
	outPath := fs.String("out", "", "with --config: write the tuned config here")
	metrics := fs.String("metrics", "", "read a running Sluice's admin /metrics (URL or host:port) instead of saved results")
	window := fs.Duration("window", 30*time.Second, "with --metrics: how long to watch the counters grow")
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	if *metrics != "" && fs.NArg() > 0 {
		return usagef("tune reads saved results or --metrics, not both")
	}
	if *metrics == "" && fs.NArg() == 0 {
		return usagef("tune needs saved bench results or a running server: sluice tune [flags] RESULT.json... | --metrics URL (-h for help)")
	}
	if *window <= 0 {
		return usagef("--window must be > 0, got %s", *window)
	}
	if *outPath != "" && *cfgPath == "" {
		return usagef("--out needs --config")
	}
	if *slo <= 0 {
		return usagef("--slo-ttft must be > 0, got %s", *slo)
	}
	var runs []tuneRun
	var live []string
	for _, p := range fs.Args() {
		r, err := loadTuneRun(p)
		if err != nil {
			return usagef("%v", err)
		}
		runs = append(runs, r)
	}
	if *metrics != "" {
		url := metricsURL(*metrics)
		first, last, elapsed, inflight, err := watchMetrics(ctx, url, *window, min(time.Second, *window/2))
		if err != nil {
			return err
		}
		r, notes, err := liveRun(url, first, last, elapsed, inflight, *slo)
		if err != nil {
			return err
		}
		runs = append(runs, r)
		live = append([]string{"measured at the server's current load: the service rate is what it served within the SLO, its capacity only at the knee"}, notes...)
	}
	recs, notes, err := tune(runs, *slo, *limit)
	if err != nil {
		return usagef("%v", err)
	}
	notes = append(notes, live...)
	snippet := tuneSnippet(recs, notes)
	fmt.Fprint(e.stdout, snippet)
	if *cfgPath == "" {
		return nil
	}
	raw, err := os.ReadFile(*cfgPath)
	if err != nil {
		return usagef("--config: %v", err)
	}
	merged, changes, err := applyTune(raw, recs)
	if err != nil {
		return usagef("--config %s: %v", *cfgPath, err)
	}
	if _, err := config.Parse(merged); err != nil {
		return usagef("--config %s with the recommendations: %v", *cfgPath, err)
	}
	fmt.Fprintf(e.stdout, "# checked: %s with these values passes 'sluice config check'\n", *cfgPath)
	if len(changes) > 0 {
		if *outPath != "" {
			fmt.Fprintf(e.stdout, "# %s changes values %s sets:\n", *outPath, *cfgPath)
		} else {
			fmt.Fprintf(e.stdout, "# --out would change values %s sets:\n", *cfgPath)
		}
		for _, c := range changes {
			fmt.Fprintf(e.stdout, "#   %s\n", c)
		}
	}
	if *outPath != "" {
		if err := os.WriteFile(*outPath, merged, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func loadTuneRun(path string) (tuneRun, error) {
	d, err := report.Load(path)
	if err != nil {
		return tuneRun{}, err
	}
	r := tuneRun{path: path, tenants: map[string]tuneTenant{}}
	// Rates per second of the measured arrival window: good requests are
	// what the fleet served within the SLO (a drain after the window would
	// dilute a per-benchmark-duration rate).
	good, ok := d.F("good")
	start, ok1 := d.F("window", "start_s")
	end, ok2 := d.F("window", "end_s")
	if !ok || !ok1 || !ok2 || end <= start {
		return r, fmt.Errorf("%s: no good count or measured window: not a bench result", path)
	}
	win := end - start
	r.served = good / win
	r.goodput = r.served
	r.offered, _ = d.F("schedule", "sent_rate")
	r.ttftP50, _ = d.F("median_ttft_ms")
	for _, n := range d.TenantNames() {
		var t tuneTenant
		g, _ := d.F("tenants", n, "good")
		t.served = g / win
		t.offered, _ = d.F("tenants", n, "offered_rate")
		t.concurrency, _ = d.F("tenants", n, "concurrency")
		t.maxConcurrent, _ = d.F("tenants", n, "max_concurrent_requests")
		r.tenants[n] = t
	}
	if len(r.tenants) == 0 {
		return r, fmt.Errorf("%s: no tenants", path)
	}
	return r, nil
}

// saturatedBelow: a run that served less than this share of its offered
// rate within the SLO was past the knee.
const saturatedBelow = 0.95

// tune derives the recommendations. The knee is the run that served the
// most requests within the SLO per second of arrivals; its per-tenant rate
// of those is the service rate μ. The wait the
// SLO allows is the SLO less the lightest run's median TTFT (the latency
// with no queueing). max_depth = ⌈μ·wait⌉ (Little's law): a request behind
// that many waits about the allowed wait, so deeper queues only serve late.
func tune(runs []tuneRun, slo time.Duration, limit bool) ([]tuneRec, []string, error) {
	if len(runs) == 0 {
		return nil, nil, fmt.Errorf("no runs")
	}
	knee, light := 0, 0
	for i, r := range runs {
		if r.goodput > runs[knee].goodput {
			knee = i
		}
		if r.offered < runs[light].offered {
			light = i
		}
	}
	k := runs[knee]
	base := time.Duration(runs[light].ttftP50 * float64(time.Millisecond))
	wait := (slo - base).Truncate(100 * time.Millisecond)
	if wait < 100*time.Millisecond {
		return nil, nil, fmt.Errorf("the SLO %s leaves no queue wait: unqueued median TTFT is already %s", slo, base.Round(time.Millisecond))
	}
	// A knee is where more offered load stops being served in time. When
	// every run served (nearly) all it was offered, none reached it: the
	// best run's rate is only a lower bound of the service rate.
	saturated := false
	for _, r := range runs {
		if r.offered > 0 && r.served < saturatedBelow*r.offered {
			saturated = true
		}
	}
	at := "at the knee"
	var notes []string
	if saturated {
		notes = append(notes, fmt.Sprintf("knee: %s (%.2f req/s served within the SLO per second of arrivals); SLO TTFT %s; unqueued median TTFT %s (%s)",
			k.path, k.served, slo, base.Round(time.Millisecond), runs[light].path))
	} else {
		at = "at the best run"
		notes = append(notes, fmt.Sprintf("no knee: no run saturated (each served at least %.0f%% of its offered rate within the SLO), so capacity is above %.2f req/s (%s); the values below use that rate and are a lower bound: sweep higher rates to find the knee; SLO TTFT %s; unqueued median TTFT %s (%s)",
			100*saturatedBelow, k.served, k.path, slo, base.Round(time.Millisecond), runs[light].path))
	}
	names := make([]string, 0, len(k.tenants))
	for n := range k.tenants {
		names = append(names, n)
	}
	sort.Strings(names)
	var recs []tuneRec
	for _, n := range names {
		t := k.tenants[n]
		if t.served <= 0 {
			return nil, nil, fmt.Errorf("tenant %s served nothing %s (%s)", n, at, k.path)
		}
		depth := max(1, int(math.Ceil(t.served*wait.Seconds())))
		rec := tuneRec{name: n, maxWait: wait, maxDepth: depth}
		rec.why[0] = fmt.Sprintf("SLO TTFT %s - unqueued median TTFT %s: a request that cannot start in time is refused (504), not served late", slo, base.Round(time.Millisecond))
		rec.why[1] = fmt.Sprintf("Little's law: %.2f req/s served in time %s x %s acceptable wait", t.served, at, wait)
		if limit {
			rec.concurrency = max(1, int(math.Ceil(t.maxConcurrent)))
			rec.why[2] = fmt.Sprintf("peak in flight %s (mean %.1f): more only queues inside vLLM", at, t.concurrency)
		}
		recs = append(recs, rec)
	}
	// Predicted attainment: with the queue bounded to the SLO, what is
	// admitted is served in time, and at most μ of the offered rate is.
	for _, r := range runs {
		if r.offered <= 0 {
			continue
		}
		notes = append(notes, fmt.Sprintf("predicted SLO attainment at %.2f req/s offered: %.1f%% (min(1, %.2f in time / offered))",
			r.offered, 100*math.Min(1, k.served/r.offered), k.served))
	}
	return recs, notes, nil
}

func tuneSnippet(recs []tuneRec, notes []string) string {
	var b strings.Builder
	b.WriteString("# sluice tune\n")
	for _, n := range notes {
		b.WriteString("# " + n + "\n")
	}
	b.WriteString("tenants:\n")
	for _, r := range recs {
		fmt.Fprintf(&b, "  - name: %s\n", r.name)
		fmt.Fprintf(&b, "    queue: {max_wait: %s, max_depth: %d}\n", r.maxWait, r.maxDepth)
		fmt.Fprintf(&b, "    # max_wait %s: %s\n", r.maxWait, r.why[0])
		fmt.Fprintf(&b, "    # max_depth %d: %s\n", r.maxDepth, r.why[1])
		if r.concurrency > 0 {
			fmt.Fprintf(&b, "    concurrency: %d\n", r.concurrency)
			fmt.Fprintf(&b, "    # concurrency %d: %s\n", r.concurrency, r.why[2])
		}
	}
	return b.String()
}
