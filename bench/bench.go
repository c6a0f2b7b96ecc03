package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/report"
	"github.com/sluicehq/sluice/bench/scenarios"
	"github.com/sluicehq/sluice/bench/stats"
	"github.com/sluicehq/sluice/bench/workload"
	"github.com/sluicehq/sluice/vllm/sim"
)

// ResultSchema is the JSON Schema of a saved result (sluice.bench.result/v1).
//
//go:embed result.schema.json
var ResultSchema []byte

// ErrUsage marks a problem with the options (the command exits 2).
var ErrUsage = errors.New("bad bench options")

// Options configures a run. Field names follow `vllm bench serve` flags;
// zero values take vLLM's defaults.
type Options struct {
	// BaseURL is the target (B, or the only one). Required unless SimReplicas > 0.
	BaseURL string
	// Endpoint, default "/v1/completions".
	Endpoint string
	// Backend: "openai" (default) or "openai-chat".
	Backend string
	// Model: default the first id of /v1/models.
	Model string
	// DatasetName: "random" (default; forces ignore_eos) or "custom"
	// (JSONL at DatasetPath: {prompt|prompt_ids, output_len, tenant?}).
	DatasetName string
	// DatasetPath is the custom dataset file.
	DatasetPath string
	// NumPrompts per tenant when no duration is set. Default 1000.
	NumPrompts int
	// RandomInputLen, RandomOutputLen: defaults 1024 and 128.
	RandomInputLen, RandomOutputLen int
	// RandomRangeRatio: default 0.
	RandomRangeRatio float64
	// RequestRate: "inf" (default) or rps; without --workload it is the
	// one tenant's rate.
	RequestRate string
	// Burstiness is the gamma shape. Default 1 (Poisson).
	Burstiness float64
	// MaxConcurrency caps requests in flight. 0: unlimited.
	MaxConcurrency int
	// Goodput holds SLOs in ms keyed ttft, tpot, e2el (tenant defaults).
	Goodput map[string]float64
	// PercentileMetrics selects the printed sections. Default all four.
	PercentileMetrics []string
	// MetricPercentiles. Default [99].
	MetricPercentiles []float64
	// Seed of the schedule (overridden by the workload file's seed).
	Seed uint64
	// APIKey for the single-tenant mode (OPENAI_API_KEY).
	APIKey string

	// Workload is a workload file or a preset name.
	Workload string
	// Duration stops arrivals at this time instead of after NumPrompts.
	Duration time.Duration
	// WarmupDuration: requests intended earlier are sent but not measured.
	WarmupDuration time.Duration
	// DrainTimeout after the last arrival. Default 120s.
	DrainTimeout time.Duration
	// RequestTimeout per request (client_timeout). 0: off.
	RequestTimeout time.Duration
	// Progress interval for the live line on Stderr. 0: off.
	Progress time.Duration
	// Capacity resolves "Nx" rates (rps).
	Capacity float64
	// Baseline is a saved result without the aggressor (isolation ratio).
	Baseline string
	// ExcludeTenant leaves these tenants out of the schedule.
	ExcludeTenant []string
	// RateScale multiplies every rate (sweep). 0 means 1.
	RateScale float64

	// SaveResult writes the JSON result to ResultDir/ResultFilename.
	SaveResult     bool
	ResultDir      string
	ResultFilename string
	Metadata       map[string]string
	HTML           string // self-contained HTML report path
	CSV            string // CSV path (reasons go to <csv>.reasons.csv)
	SaveRequests   string // per-request JSONL path
	SaveDetailed   bool   // keep exact ITL per request in the JSONL

	// Label names the run in outputs ("A", "B", …).
	Label string
	// RunIndex and Salt vary X-Request-Id and prompt content per run.
	RunIndex int
	Salt     uint64
	// IDPrefix starts every X-Request-Id.
	IDPrefix string
	// Preconnect opens this many connections per target before t0 with
	// GET /v1/models, so the run starts on warm connections. Default 16;
	// negative disables.
	Preconnect int

	// SimReplicas > 0 starts that many in-process simulated vLLM replicas
	// on loopback and targets them (BaseURL is then ignored).
	SimReplicas int
	// SimConfig configures each simulated replica (ReplicaIndex is set).
	SimConfig sim.Config

	// Client overrides the HTTP client (tests).
	Client *http.Client
	// Stdout receives the report; Stderr progress and warnings. Nil: discard.
	Stdout, Stderr io.Writer
	// Now is the clock for result dates. Nil: time.Now.
	Now func() time.Time
}

// Result is one analysed run.
type Result struct {
	Doc      report.Doc
	Analysis *stats.Result
	Schedule *workload.Schedule
	Raw      *loadgen.Result
}

func (o *Options) defaults() {
	if o.Endpoint == "" {
		o.Endpoint = "/v1/completions"
	}
	if o.Backend == "" {
		o.Backend = "openai"
	}
	if o.DatasetName == "" {
		o.DatasetName = "random"
	}
	if o.NumPrompts == 0 {
		o.NumPrompts = 1000
	}
	if o.RandomInputLen == 0 {
		o.RandomInputLen = 1024
	}
	if o.RandomOutputLen == 0 {
		o.RandomOutputLen = 128
	}
	if o.RequestRate == "" {
		o.RequestRate = "inf"
	}
	if o.Burstiness == 0 {
		o.Burstiness = 1
	}
	if len(o.PercentileMetrics) == 0 {
		o.PercentileMetrics = []string{"ttft", "tpot", "itl", "e2el"}
	}
	if len(o.MetricPercentiles) == 0 {
		o.MetricPercentiles = []float64{99}
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 120 * time.Second
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Label == "" {
		o.Label = o.Backend
	}
	if o.Preconnect == 0 {
		o.Preconnect = 16
	}
}

func usage(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrUsage)
}

// flagDefaults turns the vLLM-style flags into tenant defaults.
func (o *Options) flagDefaults() (workload.Tenant, error) {
	var t workload.Tenant
	rate, err := workload.ParseRate(o.RequestRate)
	if err != nil {
		return t, usage("--request-rate: %v", err)
	}
	b := workload.Rate{Value: o.Burstiness}
	t.Rate = &rate
	t.Arrival = &workload.Arrival{Burstiness: &b}
	t.Input = &workload.Length{Dist: "uniform", Mean: float64(o.RandomInputLen), RangeRatio: o.RandomRangeRatio}
	t.Output = &workload.Length{Dist: "uniform", Mean: float64(o.RandomOutputLen), RangeRatio: o.RandomRangeRatio}
	if len(o.Goodput) > 0 {
		t.SLO = &workload.SLO{}
		for k, v := range o.Goodput {
			switch k {
			case "ttft":
				t.SLO.TTFTMs = &v
			case "tpot":
				t.SLO.TPOTMs = &v
			case "e2el":
				t.SLO.E2ELMs = &v
			default:
				return t, usage("--goodput: unknown metric %q (ttft, tpot, e2el)", k)
			}
		}
	}
	return t, nil
}

// Spec returns the workload the options describe: the file (or preset)
// with the flags as defaults, or one tenant "default" from the flags.
func (o *Options) Spec() (*workload.Spec, error) {
	o.defaults()
	switch {
	case o.DatasetName == "custom" && o.DatasetPath == "":
		return nil, usage("--dataset-name custom needs --dataset-path")
	case o.DatasetName != "random" && o.DatasetName != "custom":
		return nil, usage("--dataset-name %q is not supported (random, custom)", o.DatasetName)
	}
	fd, err := o.flagDefaults()
	if err != nil {
		return nil, err
	}
	if o.Workload == "" {
		np := o.NumPrompts
		fd.Name, fd.APIKey, fd.NumPrompts = "default", o.APIKey, &np
		return &workload.Spec{Seed: o.Seed, Warmup: workload.Duration(o.WarmupDuration), Tenants: []workload.Tenant{fd}}, nil
	}
	var s *workload.Spec
	if _, statErr := os.Stat(o.Workload); statErr == nil {
		s, err = workload.Load(o.Workload)
	} else {
		var b []byte
		if b, err = scenarios.Get(o.Workload); err == nil {
			s, err = workload.Parse(b, nil)
		}
	}
	if err != nil {
		return nil, usage("--workload: %v", err)
	}
	fd.Rate = nil // a file's tenants state their rates
	s.Defaults = mergeDefaults(s.Defaults, fd)
	if o.WarmupDuration > 0 {
		s.Warmup = workload.Duration(o.WarmupDuration)
	}
	return s, nil
}

// mergeDefaults fills nil fields of the file's defaults from the flags;
// SLOs merge key by key (the file wins).
func mergeDefaults(file, flags workload.Tenant) workload.Tenant {
	if file.Input == nil {
		file.Input = flags.Input
	}
	if file.Output == nil {
		file.Output = flags.Output
	}
	if file.Arrival == nil {
		file.Arrival = flags.Arrival
	}
	if file.Rate == nil {
		file.Rate = flags.Rate
	}
	if flags.SLO != nil {
		if file.SLO == nil {
			file.SLO = flags.SLO
		} else {
			s := *file.SLO
			if s.TTFTMs == nil {
				s.TTFTMs = flags.SLO.TTFTMs
			}
			if s.TPOTMs == nil {
				s.TPOTMs = flags.SLO.TPOTMs
			}
			if s.E2ELMs == nil {
				s.E2ELMs = flags.SLO.E2ELMs
			}
			file.SLO = &s
		}
	}
	return file
}

// BuildSchedule validates the options and draws the schedule.
func BuildSchedule(o Options) (*workload.Schedule, error) {
	s, err := o.Spec()
	if err != nil {
		return nil, err
	}
	var data []workload.Entry
	if o.DatasetName == "custom" {
		if data, err = workload.LoadDataset(o.DatasetPath); err != nil {
			return nil, usage("--dataset-path: %v", err)
		}
	}
	sc, err := workload.Build(s, workload.Options{Capacity: o.Capacity, NumPrompts: o.NumPrompts, Duration: o.Duration,
		RateScale: o.RateScale, Exclude: o.ExcludeTenant, Dataset: data})
	if err != nil {
		return nil, usage("workload: %v", err)
	}
	for _, e := range o.ExcludeTenant {
		found := false
		for _, p := range sc.Tenants {
			found = found || p.Name == e
		}
		if !found {
			return nil, usage("--exclude-tenant: no tenant %q", e)
		}
	}
	return sc, nil
}

// withSims starts o.SimReplicas simulated replicas on loopback, calls fn
// with their URLs, then stops them. With no sims it calls fn with BaseURL.
func withSims(ctx context.Context, o *Options, fn func(ctx context.Context, urls []string) error) error {
	if o.SimReplicas <= 0 {
		if o.BaseURL == "" {
			return usage("--base-url is required")
		}
		return fn(ctx, strings.Split(o.BaseURL, ","))
	}
	g, gctx := errgroup.WithContext(ctx)
	simCtx, stopSims := context.WithCancel(gctx)
	var urls []string
	for i := range o.SimReplicas {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stopSims()
			_ = g.Wait()
			return fmt.Errorf("sim replica %d: %w", i, err)
		}
		cfg := o.SimConfig
		cfg.ReplicaIndex = i
		urls = append(urls, "http://"+ln.Addr().String())
		g.Go(func() error { return sim.Serve(simCtx, cfg, ln) })
	}
	var runErr error
	g.Go(func() error {
		defer stopSims()
		runErr = fn(simCtx, urls)
		return nil
	})
	if err := g.Wait(); err != nil {
		return fmt.Errorf("sim replicas: %w", err)
	}
	return runErr
}

// discoverModel returns the first id of /v1/models.
func discoverModel(ctx context.Context, client *http.Client, base, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("models: status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Data) == 0 {
		return "", fmt.Errorf("models: no model listed (pass --model)")
	}
	return body.Data[0].ID, nil
}

func defaultClient(o *Options) *http.Client {
	if o.Client != nil {
		return o.Client
	}
	return &http.Client{Transport: loadgen.NewTransport(max(o.MaxConcurrency, 1024))}
}

// execute runs sched against targets and analyses it (no output files).
func execute(ctx context.Context, o *Options, sched *workload.Schedule, targets []string, client *http.Client) (*Result, error) {
	if o.Model == "" {
		key := ""
		if len(sched.Tenants) > 0 {
			key = sched.Tenants[0].APIKey
		}
		m, err := discoverModel(ctx, client, targets[0], key)
		if err != nil {
			return nil, err
		}
		o.Model = m
	}
	cfg := loadgen.Config{Targets: targets, Endpoint: o.Endpoint, Backend: o.Backend, Model: o.Model,
		IgnoreEOS: o.DatasetName == "random", MaxConcurrency: o.MaxConcurrency, RequestTimeout: o.RequestTimeout,
		DrainTimeout: o.DrainTimeout, IDPrefix: o.IDPrefix, Run: o.RunIndex, Salt: o.Salt, Preconnect: o.Preconnect,
		Client: client}
	if o.Progress > 0 {
		cfg.Progress, cfg.ProgressEvery = o.Stderr, o.Progress
	}
	raw, err := loadgen.Run(ctx, sched, cfg)
	if raw == nil {
		return nil, err
	}
	ps := o.MetricPercentiles
	if !slices.Contains(ps, 99) {
		ps = append(slices.Clone(ps), 99) // isolation and ratios read p99
	}
	an := stats.Analyze(sched, raw, stats.Options{Percentiles: ps})
	iso, isoErr := isolation(o, an)
	if isoErr != nil {
		return nil, isoErr
	}
	doc, derr := report.Build(an, report.Meta{Label: o.Label, Backend: o.Backend, Endpoint: o.Endpoint,
		BaseURL: strings.Join(targets, ","), ModelID: o.Model, RequestRate: requestRate(o, sched), Burstiness: o.Burstiness,
		MaxConcurrency: o.MaxConcurrency, Date: o.Now(), Metadata: o.Metadata, Config: configFor(o, sched), Isolation: iso})
	if derr != nil {
		return nil, derr
	}
	if o.SaveDetailed {
		addDetailed(doc, sched, raw)
	}
	return &Result{Doc: doc, Analysis: an, Schedule: sched, Raw: raw}, err
}

// requestRate is the flag as given, or for a workload the total planned
// rate of the tenants that sent ("inf" if any sends at t0).
func requestRate(o *Options, sched *workload.Schedule) string {
	if o.Workload == "" {
		return o.RequestRate
	}
	sent := map[int]bool{}
	for _, r := range sched.Requests {
		sent[r.Tenant] = true
	}
	total := 0.0
	for i, p := range sched.Tenants {
		if sent[i] {
			total += p.Rate
		}
	}
	if math.IsInf(total, 1) {
		return "inf"
	}
	return strconv.FormatFloat(total, 'f', -1, 64)
}

// addDetailed adds vLLM's --save-detailed arrays, one entry per measured
// request in schedule order: input_lens, output_lens (0 unless success),
// ttfts and itls in seconds, errors ("" on success, else outcome/reason)
// and generated_texts (always "": Sluice does not keep text).
func addDetailed(doc report.Doc, sched *workload.Schedule, raw *loadgen.Result) {
	var in, out []any
	var ttfts, itls, errs, texts []any
	for i := range raw.Records {
		r := &raw.Records[i]
		if r.Intended < sched.Warmup {
			continue
		}
		in = append(in, r.InTokens)
		texts = append(texts, "")
		if !r.Outcome.OK() {
			out, ttfts, itls = append(out, 0), append(ttfts, 0.0), append(itls, []any{})
			errs = append(errs, strings.TrimSuffix(string(r.Outcome)+"/"+r.Reason, "/"))
			continue
		}
		gaps := make([]any, len(r.ITL))
		for j, g := range r.ITL {
			gaps[j] = g.Seconds()
		}
		out, ttfts, itls, errs = append(out, r.OutTokens), append(ttfts, r.TTFT().Seconds()), append(itls, gaps), append(errs, "")
	}
	doc["input_lens"], doc["output_lens"], doc["ttfts"], doc["itls"], doc["errors"], doc["generated_texts"] = in, out, ttfts, itls, errs, texts
}

// configFor records the run's configuration with API keys masked.
func configFor(o *Options, sched *workload.Schedule) map[string]any {
	tenants := []any{}
	for _, p := range sched.Tenants {
		tenants = append(tenants, map[string]any{"name": p.Name, "api_key": report.MaskKey(p.APIKey), "role": p.Role,
			"weight": p.Weight, "rate": num(p.Rate), "burstiness": num(p.Burstiness), "deadline_s": p.Deadline.Seconds(),
			"input": p.Input, "output": p.Output, "pattern": p.Pattern.Type})
	}
	return map[string]any{"workload": o.Workload, "seed": sched.Seed, "duration_s": sched.Duration.Seconds(),
		"warmup_s": sched.Warmup.Seconds(), "capacity": o.Capacity, "rate_scale": o.RateScale, "exclude": o.ExcludeTenant,
		"max_concurrency": o.MaxConcurrency, "request_timeout_s": o.RequestTimeout.Seconds(),
		"drain_timeout_s": o.DrainTimeout.Seconds(), "metric_percentiles": o.MetricPercentiles, "tenants": tenants}
}

func num(f float64) any {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return f
}

// isolation compares victims with a baseline result (BENCH.md §6).
func isolation(o *Options, an *stats.Result) (map[string]any, error) {
	if o.Baseline == "" {
		return nil, nil
	}
	base, err := report.Load(o.Baseline)
	if err != nil {
		return nil, usage("--baseline: %v", err)
	}
	v := an.Victims
	if v == nil {
		v = &an.Summary
	}
	key := "p" + stats.PWord(99) + "_ttft_ms"
	bp, ok := base.F("victims", key)
	if !ok {
		bp, _ = base.F(key)
	}
	ba, ok := base.F("victims", "slo_attainment")
	if !ok {
		ba, _ = base.F("slo_attainment")
	}
	cur := v.TTFT.P["99"]
	m := map[string]any{"baseline": o.Baseline, "victims_p99_ttft_ms": cur, "baseline_p99_ttft_ms": bp,
		"victims_attainment": v.SLOAttainment, "baseline_attainment": ba, "p99_ttft_ratio": nil, "attainment_ratio": nil}
	if len(o.ExcludeTenant) > 0 {
		m["excluded"] = strings.Join(o.ExcludeTenant, ",")
	}
	if bp > 0 {
		m["p99_ttft_ratio"] = cur / bp
	}
	if ba > 0 {
		m["attainment_ratio"] = v.SLOAttainment / ba
	}
	return m, nil
}

// Run builds the schedule, runs it against the target (or in-process
// simulated replicas), prints the report and writes the requested files.
// If ctx is cancelled mid-run, the partial result is reported and ctx's
// error returned.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	if err := makeOutputDirs(&o); err != nil {
		return nil, err
	}
	sched, err := BuildSchedule(o)
	if err != nil {
		return nil, err
	}
	printHeader(&o, sched)
	var res *Result
	err = withSims(ctx, &o, func(ctx context.Context, urls []string) error {
		var e error
		res, e = execute(ctx, &o, sched, urls, defaultClient(&o))
		return e
	})
	if res == nil {
		return nil, err
	}
	report.WriteText(o.Stdout, res.Doc, o.PercentileMetrics)
	if werr := writeOutputs(&o, res, []report.Section{report.RunSection(o.Label, res.Doc, o.PercentileMetrics)}, []report.Doc{res.Doc}, ""); werr != nil {
		return res, werr
	}
	return res, err
}

func printHeader(o *Options, sched *workload.Schedule) {
	fmt.Fprintf(o.Stdout, "sluice bench: %d requests from %d tenant(s), seed %d; vLLM flag names (multi-value flags take commas; --percentile-metrics defaults to ttft,tpot,itl,e2el)\n",
		len(sched.Requests), len(sched.Tenants), sched.Seed)
}

func resultPath(o *Options, suffix string) string {
	name := o.ResultFilename
	if name == "" {
		mc := ""
		if o.MaxConcurrency > 0 {
			mc = fmt.Sprintf("-concurrency%d", o.MaxConcurrency)
		}
		model := o.Model
		if i := strings.LastIndex(model, "/"); i >= 0 {
			model = model[i+1:]
		}
		name = fmt.Sprintf("%s-%sqps%s-%s-%s.json", o.Backend, o.RequestRate, mc, model, o.Now().UTC().Format("20060102-150405"))
	}
	if suffix != "" {
		name = strings.TrimSuffix(name, ".json") + "-" + suffix + ".json"
	}
	return filepath.Join(o.ResultDir, name)
}

// makeOutputDirs creates the directories the output files go to before a
// run starts, as vllm bench serve creates --result-dir
// (compute_result_filename, vllm/benchmarks/serve.py): a missing directory
// must not cost a whole run, and one that cannot be made fails at once.
func makeOutputDirs(o *Options) error {
	var dirs []string
	if o.SaveResult && o.ResultDir != "" {
		dirs = append(dirs, o.ResultDir)
	}
	for _, f := range []string{o.CSV, o.HTML, o.SaveRequests} {
		if f != "" {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("output directory: %w", err)
		}
	}
	return nil
}

func writeFile(path string, fn func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := fn(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// runName names run i of several in file names and CSV rows: its label
// and its index apart ("rate10-run2"), so a label ending in a digit never
// runs into the index ("rate102").
func runName(d report.Doc, i int) string {
	return fmt.Sprintf("%v-run%d", d["label"], i)
}

// writeOutputs writes --save-result, --csv, --save-requests (last run) and
// --html for one or more results.
func writeOutputs(o *Options, last *Result, sections []report.Section, docs []report.Doc, title string) error {
	var errs []error
	if o.SaveResult {
		for i, d := range docs {
			suffix := ""
			if len(docs) > 1 {
				suffix = runName(d, i)
			}
			errs = append(errs, writeFile(resultPath(o, suffix), func(w io.Writer) error {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(d)
			}))
		}
	}
	if o.CSV != "" {
		rp := strings.TrimSuffix(o.CSV, ".csv") + ".reasons.csv"
		errs = append(errs, writeFile(o.CSV, func(w io.Writer) error {
			return writeFile(rp, func(rw io.Writer) error {
				for i, d := range docs {
					run := fmt.Sprintf("%v", d["label"])
					if len(docs) > 1 {
						run = runName(d, i)
					}
					if err := report.WriteCSV(w, rw, run, d, i == 0); err != nil {
						return err
					}
				}
				return nil
			})
		}))
	}
	if o.SaveRequests != "" && last != nil && last.Raw != nil {
		errs = append(errs, writeFile(o.SaveRequests, func(w io.Writer) error {
			return report.WriteJSONL(w, last.Schedule, last.Raw.Records, o.SaveDetailed)
		}))
	}
	if o.HTML != "" {
		if title == "" {
			title = fmt.Sprintf("sluice bench — %s, %s", o.Workload, o.Now().UTC().Format(time.RFC3339))
		}
		errs = append(errs, writeFile(o.HTML, func(w io.Writer) error {
			return report.WriteHTML(w, report.Page{Title: title, Sections: sections, Results: docs})
		}))
	}
	return errors.Join(errs...)
}

// Compare prints B/A ratios from two saved results.
func Compare(w io.Writer, a, b report.Doc) {
	report.WriteRatios(w, []report.Doc{a}, []report.Doc{b})
}

// TenantNames lists a result's tenants (sorted), for orchestration.
func TenantNames(d report.Doc) []string {
	n := d.TenantNames()
	sort.Strings(n)
	return n
}
