package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bench"
	"github.com/sluicehq/sluice/bench/report"
	"github.com/sluicehq/sluice/vllm/sim"
)

// listFlag collects comma-separated or repeated values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// benchFlags binds the flags shared by run, ab and sweep.
type benchFlags struct {
	o                                    bench.Options
	goodput, pctMetrics, pcts, meta, exc listFlag
	rate                                 string
	simSeqs, simKV                       int
	simPrefill                           float64
	simStep, simStepPerSeq               time.Duration
	simSeed                              int64
}

func newBenchFlags(name string) (*flag.FlagSet, *benchFlags) {
	fs := newFlags("bench " + name)
	b := &benchFlags{}
	o := &b.o
	fs.StringVar(&o.BaseURL, "base-url", "", "target base URL (http://host:port)")
	fs.StringVar(&o.Endpoint, "endpoint", "/v1/completions", "API path")
	fs.StringVar(&o.Backend, "backend", "openai", "openai | openai-chat")
	fs.StringVar(&o.Model, "model", "", "model (default: first id of /v1/models)")
	fs.StringVar(&o.DatasetName, "dataset-name", "random", "random | custom")
	fs.StringVar(&o.DatasetPath, "dataset-path", "", "custom dataset JSONL: {prompt|prompt_ids, output_len, tenant?}")
	fs.IntVar(&o.NumPrompts, "num-prompts", 1000, "requests per tenant when no duration is set")
	fs.IntVar(&o.RandomInputLen, "random-input-len", 1024, "input tokens")
	fs.IntVar(&o.RandomOutputLen, "random-output-len", 128, "output tokens")
	fs.Float64Var(&o.RandomRangeRatio, "random-range-ratio", 0, "length range ratio")
	fs.StringVar(&b.rate, "request-rate", "inf", "requests per second, or inf")
	fs.Float64Var(&o.Burstiness, "burstiness", 1, "gamma shape of inter-arrivals (1 = Poisson)")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", 0, "cap on requests in flight (0 = none)")
	fs.Var(&b.goodput, "goodput", "goodput SLOs as `metric:ms,...`, e.g. ttft:500,tpot:50,e2el:9000")
	fs.Var(&b.pctMetrics, "percentile-metrics", "the metrics whose percentiles are printed, a `list` of ttft,tpot,itl,e2el (default all four)")
	fs.Var(&b.pcts, "metric-percentiles", "the percentiles to print, a `list` like 50,90,99 (default 99)")
	fs.Var(saveResultFlag{&o.SaveResult}, "save-result", "save the JSON result (a switch: the file is --result-dir/--result-filename)")
	fs.StringVar(&o.ResultDir, "result-dir", "", "directory for --save-result")
	fs.StringVar(&o.ResultFilename, "result-filename", "", "file name for --save-result")
	fs.Var(&b.meta, "metadata", "`KEY=VALUE` pairs saved with the result (repeat or comma-separate)")
	fs.Uint64Var(&o.Seed, "seed", 0, "schedule seed")
	fs.StringVar(&o.Workload, "workload", "", "workload file (YAML/JSON) or preset name")
	fs.DurationVar(&o.Duration, "duration", 0, "stop arrivals after this long")
	fs.DurationVar(&o.WarmupDuration, "warmup-duration", 0, "sent but not measured")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", 120*time.Second, "wait after the last arrival")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", 0, "client-side cut-off per request")
	fs.DurationVar(&o.Progress, "progress", 5*time.Second, "live line interval (0 = off)")
	fs.StringVar(&o.HTML, "html", "", "self-contained HTML report")
	fs.StringVar(&o.CSV, "csv", "", "CSV of per-tenant rows")
	fs.StringVar(&o.SaveRequests, "save-requests", "", "per-request JSONL")
	fs.BoolVar(&o.SaveDetailed, "save-detailed", false, "keep exact ITL per request in --save-requests")
	fs.Float64Var(&o.Capacity, "capacity", 0, "rps that rates written as Nx multiply")
	fs.StringVar(&o.Baseline, "baseline", "", "saved result without the aggressor (isolation)")
	fs.Var(&b.exc, "exclude-tenant", "leave tenant `NAME` out (repeat or comma-separate)")
	fs.StringVar(&o.IDPrefix, "request-id-prefix", "bench-", "X-Request-Id prefix")
	fs.IntVar(&o.Preconnect, "preconnect", 16, "connections to open per target before t0 (negative: none)")
	fs.IntVar(&o.SimReplicas, "sim-replicas", 0, "start N in-process simulated vLLM replicas and target them")
	fs.IntVar(&b.simSeqs, "sim-max-num-seqs", 0, "simulator max-num-seqs (default 64)")
	fs.IntVar(&b.simKV, "sim-kv-tokens", 0, "simulator KV tokens (default 65536)")
	fs.Float64Var(&b.simPrefill, "sim-prefill-tps", 0, "simulator prefill tokens/s")
	fs.DurationVar(&b.simStep, "sim-decode-step", 0, "simulator decode step")
	fs.DurationVar(&b.simStepPerSeq, "sim-decode-step-per-seq", 0, "simulator decode step per sequence")
	fs.Int64Var(&b.simSeed, "sim-seed", 0, "simulator seed")
	return fs, b
}

// finish converts the parsed flag values into options.
func (b *benchFlags) finish(e env) (bench.Options, error) {
	o := b.o
	o.RequestRate = b.rate
	o.Stdout, o.Stderr = e.stdout, e.stderr
	o.APIKey = os.Getenv("OPENAI_API_KEY")
	o.PercentileMetrics = b.pctMetrics
	for _, m := range b.pctMetrics {
		switch m {
		case "ttft", "tpot", "itl", "e2el":
		default:
			return o, usagef("--percentile-metrics: unknown metric %q", m)
		}
	}
	for _, p := range b.pcts {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || v > 100 {
			return o, usagef("--metric-percentiles: bad percentile %q", p)
		}
		o.MetricPercentiles = append(o.MetricPercentiles, v)
	}
	if len(b.goodput) > 0 {
		o.Goodput = map[string]float64{}
		for _, g := range b.goodput {
			k, v, ok := strings.Cut(g, ":")
			ms, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil || ms <= 0 {
				return o, usagef("--goodput: want metric:ms, got %q", g)
			}
			o.Goodput[k] = ms
		}
	}
	if len(b.meta) > 0 {
		o.Metadata = map[string]string{}
		for _, m := range b.meta {
			k, v, ok := strings.Cut(m, "=")
			if !ok || k == "" {
				return o, usagef("--metadata: want KEY=VALUE, got %q", m)
			}
			o.Metadata[k] = v
		}
	}
	o.ExcludeTenant = b.exc
	o.SimConfig = sim.Config{MaxNumSeqs: b.simSeqs, KVTokens: b.simKV, PrefillTPS: b.simPrefill, DecodeStep: b.simStep,
		DecodeStepPerSeq: b.simStepPerSeq, Seed: b.simSeed}
	if o.SimReplicas > 0 {
		if err := o.SimConfig.Validate(); err != nil {
			return o, usagef("simulator: %v", err)
		}
	}
	return o, nil
}

func benchErr(err error) error {
	if errors.Is(err, bench.ErrUsage) {
		return usageError{err}
	}
	return err
}

// saveResultFlag is vLLM's --save-result switch. A value given to it
// (`--save-result=out.json`) gets a hint instead of a bare parse error.
type saveResultFlag struct{ on *bool }

func (f saveResultFlag) IsBoolFlag() bool { return true }

func (f saveResultFlag) String() string {
	if f.on == nil {
		return "false"
	}
	return strconv.FormatBool(*f.on)
}

func (f saveResultFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New(saveResultHint)
	}
	*f.on = v
	return nil
}

const saveResultHint = "--save-result is a switch, as in vllm bench serve: name the file with --result-dir DIR and --result-filename NAME"

// parseBench parses a run, ab or sweep command line; a file name after
// --save-result gets the hint.
func parseBench(fs *flag.FlagSet, b *benchFlags, args []string) error {
	err := parseFlags(fs, args, 0)
	if err != nil && b.o.SaveResult && fs.NArg() > 0 {
		var fe flagError
		if errors.As(err, &fe) {
			fe.err = fmt.Errorf("unexpected argument %q: %s", fs.Arg(0), saveResultHint)
			return fe
		}
	}
	if err != nil {
		return err
	}
	return contradictions(fs, b)
}

// contradictions refuses flags another flag makes meaningless, which a
// run would otherwise ignore without a word.
func contradictions(fs *flag.FlagSet, b *benchFlags) error {
	if b.o.Workload != "" && flagSet(fs, "request-rate") {
		return usagef("--request-rate does not apply with --workload: the workload sets each tenant's rate (scale its rates with --capacity and Nx rates, or run 'sluice bench sweep --rates')")
	}
	if fs.Lookup("rates") != nil && flagSet(fs, "request-rate") {
		return usagef("--request-rate does not apply to a sweep: --rates sets each run's total rate")
	}
	return nil
}

func runBenchRun(ctx context.Context, e env, args []string) error {
	fs, b := newBenchFlags("run")
	if err := parseBench(fs, b, args); err != nil {
		return err
	}
	o, err := b.finish(e)
	if err != nil {
		return err
	}
	_, err = bench.Run(ctx, o)
	return benchErr(err)
}

func runBenchAB(ctx context.Context, e env, args []string) error {
	fs, b := newBenchFlags("ab")
	var ab bench.ABOptions
	var a listFlag
	fs.Var(&a, "a", "the replicas' base `URLs` (A, round-robin; repeat or comma-separate)")
	fs.StringVar(&ab.B, "b", "", "Sluice base URL (B)")
	fs.StringVar(&ab.Order, "order", "ABBA", "ABBA | AB")
	fs.IntVar(&ab.Repeat, "repeat", 1, "A/B pairs")
	fs.DurationVar(&ab.Settle, "settle", 30*time.Second, "wait after the replicas are idle")
	fs.DurationVar(&ab.IdleTimeout, "idle-timeout", 5*time.Minute, "bound on waiting for idle replicas")
	fs.BoolVar(&ab.SkipIdleWait, "skip-idle-wait", false, "do not poll the replicas' /metrics")
	fs.IntVar(&ab.ReplicaMaxNumSeqs, "max-num-seqs", 0, "the replicas' max-num-seqs (warns when A queues inside vLLM)")
	if err := parseBench(fs, b, args); err != nil {
		return err
	}
	o, err := b.finish(e)
	if err != nil {
		return err
	}
	ab.Options, ab.A = o, a
	_, err = bench.AB(ctx, ab)
	return benchErr(err)
}

func runBenchSweep(ctx context.Context, e env, args []string) error {
	fs, b := newBenchFlags("sweep")
	var rates listFlag
	fs.Var(&rates, "rates", "total request rates, a `list` like 2,4,8,16")
	if err := parseBench(fs, b, args); err != nil {
		return err
	}
	o, err := b.finish(e)
	if err != nil {
		return err
	}
	so := bench.SweepOptions{Options: o}
	for _, r := range rates {
		v, err := strconv.ParseFloat(r, 64)
		if err != nil || v <= 0 {
			return usagef("--rates: bad rate %q", r)
		}
		so.Rates = append(so.Rates, v)
	}
	_, err = bench.Sweep(ctx, so)
	return benchErr(err)
}

func runBenchCompare(_ context.Context, e env, args []string) error {
	fs := newFlags("bench compare")
	if err := parseFlags(fs, args, 2); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("compare needs two result files: A.json B.json")
	}
	a, err := report.Load(fs.Arg(0))
	if err != nil {
		return usagef("%v", err)
	}
	b, err := report.Load(fs.Arg(1))
	if err != nil {
		return usagef("%v", err)
	}
	bench.Compare(e.stdout, a, b)
	return nil
}
