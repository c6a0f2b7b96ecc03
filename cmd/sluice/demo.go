package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bench"
	"github.com/sluicehq/sluice/bench/stats"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/node"
	"github.com/sluicehq/sluice/vllm/sim"
)

// demoTenants: three victims at a modest rate and one tenant flooding at
// twenty times a victim's rate, more than the two replicas hold.
var demoTenants = []struct {
	name string
	rate float64
	role string
}{
	{"chat-a", 2, "victim"},
	{"chat-b", 2, "victim"},
	{"chat-c", 2, "victim"},
	{"flood", 40, "aggressor"},
}

// runDemo implements `sluice demo`: two simulated replicas, then the same
// seeded multi-tenant load twice, once sent to the replicas directly and
// once through a Sluice server with the embedded ledger, and one table
// contrasting what each tenant got both ways. --keep leaves the server and
// its status page up until interrupted.
func runDemo(ctx context.Context, e env, args []string) error {
	fs := newFlags("demo")
	dur := fs.Duration("duration", 20*time.Second, "how long load is offered, each way")
	html := fs.String("html", "", "also write the HTML report of the run through Sluice here")
	verbose := fs.Bool("verbose", false, "also print both full bench reports")
	keep := fs.Bool("keep", false, "after the runs, keep the server and its status page up until interrupted")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *dur <= 0 || *dur > 10*time.Minute {
		return usagef("--duration must be in (0, 10m]")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // best-effort cleanup of the demo's temp dir

	// Two replicas of a small GPU: 16 sequences, 16k tokens of KV each.
	var urls []string
	simDone := make(chan error, 2)
	for i := range 2 {
		sc := sim.DefaultConfig()
		sc.ReplicaIndex, sc.MaxNumSeqs, sc.KVTokens, sc.MaxModelLen = i, 16, 16384, 4096
		sc.DecodeStep, sc.DecodeStepPerSeq = 4*time.Millisecond, 500*time.Microsecond
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go func() { simDone <- sim.Serve(ctx, sc, ln) }()
		urls = append(urls, "http://"+ln.Addr().String())
	}

	keys := map[string]string{}
	var cfgText strings.Builder
	cfgText.WriteString("upstream:\n  scrape_interval: 200ms\n  replicas:\n")
	for i, u := range urls {
		fmt.Fprintf(&cfgText, "    - {name: r%d, url: %q, max_num_seqs: 16}\n", i, u)
	}
	cfgText.WriteString("gpu: {telemetry: off}\nserver: {drain_timeout: 5s}\ntenants:\n")
	for _, t := range demoTenants {
		keys[t.name] = randomKey()
		fmt.Fprintf(&cfgText, "  - {name: %s, api_keys: [%q], concurrency: 12, queue: {max_depth: 16, max_wait: 2s},\n"+
			"     budgets: [{dimension: tokens, limit: 100000000, window: 1h}]}\n", t.name, config.HashKey(keys[t.name]))
	}
	cfg, err := config.Parse([]byte(cfgText.String()))
	if err != nil {
		return fmt.Errorf("demo config: %w", err)
	}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var wl strings.Builder
	fmt.Fprintf(&wl, "seed: 7\nduration: %s\ndefaults:\n  input: {dist: uniform, mean: 256, range_ratio: 0.25}\n"+
		"  output: {dist: uniform, mean: 64, range_ratio: 0.25}\n  deadline: 10s\n  slo: {ttft_ms: 1000}\ntenants:\n", *dur)
	for _, t := range demoTenants {
		fmt.Fprintf(&wl, "  - {name: %s, api_key: %q, role: %s, rate: %g}\n", t.name, keys[t.name], t.role, t.rate)
	}
	wlPath := filepath.Join(dir, "workload.yaml")
	if err := os.WriteFile(wlPath, []byte(wl.String()), 0o600); err != nil {
		return err
	}
	// The bench reports go to stdout only with --verbose: the demo's
	// output is the contrast, and the generator's own diagnostics (its
	// connection pool, its send lag) are about the demo's client, not
	// about what is measured.
	out, errOut := io.Discard, io.Discard
	if *verbose {
		out, errOut = e.stdout, e.stderr
	}
	fmt.Fprintf(e.stdout, "sluice demo: 2 simulated replicas (16 sequences each), %d tenants (flood sends 20x a victim's rate), %s each way\n",
		len(demoTenants), *dur)
	fmt.Fprintln(e.stdout, "1/2 the load sent to the replicas directly…")
	direct, err := bench.Run(ctx, bench.Options{BaseURL: strings.Join(urls, ","), Workload: wlPath, Stdout: out, Stderr: errOut,
		DrainTimeout: 15 * time.Second, Label: "direct"})
	if err != nil {
		return fmt.Errorf("demo load, direct: %w", err)
	}

	reg := prometheus.NewRegistry()
	nodeCtx, stopNode := context.WithCancel(ctx)
	defer stopNode()
	nodeDone := make(chan error, 1)
	adminToken := randomKey()
	go func() {
		nodeDone <- node.Run(nodeCtx, cfg, node.Options{APIListener: apiLn, AdminListener: adminLn, Registry: reg, AdminToken: adminToken})
	}()
	api := "http://" + apiLn.Addr().String()
	if err := waitReady(ctx, api); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "2/2 the same load through Sluice on %s…\n\n", apiLn.Addr())
	through, err := bench.Run(ctx, bench.Options{BaseURL: api, Workload: wlPath, Stdout: out, Stderr: errOut,
		DrainTimeout: 15 * time.Second, HTML: *html, Label: "sluice"})
	if err != nil {
		return fmt.Errorf("demo load, through Sluice: %w", err)
	}
	printContrast(e.stdout, direct, through)
	printSluiceView(e, reg)
	if *keep {
		fmt.Fprintf(e.stdout, "\nstatus page: http://%s/status (log in with the admin token %s); Ctrl-C stops the demo\n", adminLn.Addr(), adminToken)
		<-ctx.Done()
	}
	stopNode()
	if err := <-nodeDone; err != nil {
		return fmt.Errorf("demo server: %w", err)
	}
	cancel()
	for range 2 {
		<-simDone
	}
	return nil
}

// printContrast prints one row per tenant: what it got from the replicas
// directly and through Sluice (requests served, failures with their
// codes, TTFT p50/p99), then the victims pooled.
func printContrast(w io.Writer, direct, through *bench.Result) {
	type side struct {
		sent, ok, failed int
		why              string
		ttft             stats.Dist
	}
	of := func(s stats.Summary) side {
		var why []string
		for o, reasons := range s.Outcomes {
			if o == "success" || o == "late" {
				continue
			}
			for r, n := range reasons {
				if r == "" {
					r = o
				}
				why = append(why, fmt.Sprintf("%s=%d", r, n))
			}
		}
		sort.Strings(why)
		return side{sent: s.Sent, ok: s.Completed, failed: s.Failed, why: strings.Join(why, " "), ttft: s.TTFT}
	}
	p99 := func(d stats.Dist) float64 { return d.P[stats.PWord(99)] }
	fmt.Fprintln(w, "What each tenant got (TTFT in ms):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "tenant\trole\tdirect: ok/sent\tfailed\tTTFT p50\tTTFT p99\t|\tSluice: ok/sent\trefused or failed\tTTFT p50\tTTFT p99")
	row := func(name, role string, d, s side) {
		fail := func(x side) string {
			if x.failed == 0 {
				return "0"
			}
			return fmt.Sprintf("%d (%s)", x.failed, x.why)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%.0f\t%.0f\t|\t%d/%d\t%s\t%.0f\t%.0f\n", name, role, d.ok, d.sent, fail(d),
			d.ttft.Median, p99(d.ttft), s.ok, s.sent, fail(s), s.ttft.Median, p99(s.ttft))
	}
	byName := map[string]stats.Tenant{}
	for _, t := range through.Analysis.Tenants {
		byName[t.Name] = t
	}
	for _, t := range direct.Analysis.Tenants {
		row(t.Name, t.Role, of(t.Summary), of(byName[t.Name].Summary))
	}
	if direct.Analysis.Victims != nil && through.Analysis.Victims != nil {
		row("victims", "pooled", of(*direct.Analysis.Victims), of(*through.Analysis.Victims))
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "Directly, the flood fills the replicas' batches and vLLM's queue, and every tenant waits behind it.\n"+
		"Through Sluice, the flood is capped at its concurrency and queue (its excess refused at once, 429 queue_full\n"+
		"or 504 deadline_exceeded), and the victims keep their first tokens fast.")
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "sk-demo-" + hex.EncodeToString(b[:])
}

// waitReady polls /readyz until the server can admit (replicas scraped).
func waitReady(ctx context.Context, api string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("demo server did not become ready within 15s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// printSluiceView prints what Sluice itself counted per tenant.
func printSluiceView(e env, reg *prometheus.Registry) {
	mfs, err := reg.Gather()
	if err != nil {
		return
	}
	type row struct{ ok, rejected, expired, other float64 }
	rows := map[string]*row{}
	reasons := map[string]map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			t := labels["tenant"]
			switch mf.GetName() {
			case "sluice_requests_total":
				r := rows[t]
				if r == nil {
					r = &row{}
					rows[t] = r
				}
				v := m.GetCounter().GetValue()
				switch labels["outcome"] {
				case "ok":
					r.ok += v
				case "rejected":
					r.rejected += v
				case "expired":
					r.expired += v
				default:
					r.other += v
				}
			case "sluice_rejections_total":
				if reasons[t] == nil {
					reasons[t] = map[string]float64{}
				}
				reasons[t][labels["reason"]] += m.GetCounter().GetValue()
			}
		}
	}
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(e.stdout, "\nWhat Sluice counted (sluice_requests_total, sluice_rejections_total):")
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "tenant\tok\trejected\texpired\tother\treasons")
	for _, n := range names {
		r := rows[n]
		var rs []string
		for k, v := range reasons[n] {
			rs = append(rs, fmt.Sprintf("%s=%.0f", k, v))
		}
		sort.Strings(rs)
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%s\n", n, r.ok, r.rejected, r.expired, r.other, strings.Join(rs, " "))
	}
	_ = tw.Flush()
}
