package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/vllm/sim"
)

// runSim serves one or more simulated vLLM replicas (ARCHITECTURE §3.1,
// VLLM.md part 3) until ctx ends (SIGINT/SIGTERM), then exits 0.
func runSim(ctx context.Context, e env, args []string) error {
	fs := newFlags("sim")
	d := sim.DefaultConfig()
	cfg := d
	listen := fs.String("listen", "127.0.0.1:8100", "address of the first replica; more replicas take the next ports")
	replicas := fs.Int("replicas", 1, "number of independent replicas on consecutive ports")
	fs.StringVar(&cfg.Model, "model", d.Model, "served model name")
	fs.Func("served-model-name", "comma-separated served model names; the first replaces --model (vLLM's --served-model-name)", func(v string) error {
		names := strings.Split(v, ",")
		cfg.Model, cfg.ServedModelNames = names[0], names[1:]
		return nil
	})
	fs.BoolVar(&cfg.DisablePrefixCaching, "no-enable-prefix-caching", false, "turn off automatic prefix caching (on by default, as in vLLM v1)")
	fs.Func("lora-modules", "LoRA adapter name=path served as its own model name; repeat or comma-separate (vLLM's --lora-modules)", func(v string) error {
		for _, m := range strings.Split(v, ",") {
			l, err := sim.ParseLoRAModule(m)
			if err != nil {
				return err
			}
			cfg.LoRAModules = append(cfg.LoRAModules, l)
		}
		return nil
	})
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", d.MaxNumSeqs, "running batch size (sequences)")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", d.MaxModelLen, "prompt + output tokens per sequence")
	fs.IntVar(&cfg.KVTokens, "kv-tokens", d.KVTokens, "KV cache size in tokens")
	fs.IntVar(&cfg.BlockSize, "block-size", d.BlockSize, "KV block size in tokens")
	fs.Float64Var(&cfg.PrefillTPS, "prefill-tps", d.PrefillTPS, "prefill speed, prompt tokens per second")
	fs.DurationVar(&cfg.DecodeStep, "decode-step", d.DecodeStep, "base step duration")
	fs.DurationVar(&cfg.DecodeStepPerSeq, "decode-step-per-seq", d.DecodeStepPerSeq, "step duration added per decoding sequence")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", 0, "token budget per step, chunked prefill (0: none)")
	fs.IntVar(&cfg.StreamInterval, "stream-interval", d.StreamInterval, "tokens per streamed chunk")
	fs.IntVar(&cfg.OutputLenMax, "output-len-max", d.OutputLenMax, "upper bound of natural (EOS) output lengths")
	fs.IntVar(&cfg.OutputLenMin, "output-len-min", d.OutputLenMin, "lower bound of natural (EOS) output lengths")
	fs.DurationVar(&cfg.KeepAliveTimeout, "timeout-keep-alive", d.KeepAliveTimeout, "close keep-alive connections idle this long, as uvicorn (negative: never)")
	fs.IntVar(&cfg.MaxLogprobs, "max-logprobs", d.MaxLogprobs, "largest logprobs/top_logprobs/prompt_logprobs the engine accepts")
	fs.BoolVar(&cfg.EnablePromptTokensDetails, "enable-prompt-tokens-details", false, "emit usage.prompt_tokens_details.cached_tokens")
	fs.StringVar(&cfg.SystemFingerprint, "fingerprint-value", d.SystemFingerprint, `system_fingerprint of responses ("none" omits it)`)
	fs.StringVar(&cfg.SchedulingPolicy, "scheduling-policy", d.SchedulingPolicy, "fcfs or priority")
	fs.IntVar(&cfg.MaxNumQueuedReqs, "max-num-queued-reqs", 0, "refuse (503) when waiting + running sequences would exceed this; streams get it after the headers (0: unbounded)")
	fs.IntVar(&cfg.MaxNumQueuedTokens, "max-num-queued-tokens", 0, "503 when waiting prompt tokens would exceed this (0: unbounded)")
	fs.Int64Var(&cfg.Seed, "seed", d.Seed, "seed of every random stream")
	fs.StringVar(&cfg.OnDisconnect, "on-disconnect", d.OnDisconnect, "abort, next-write or ignore")
	fs.BoolVar(&cfg.MetricsCompat, "metrics-compat", false, "emit the older vLLM metric variants")
	fs.BoolVar(&cfg.NoKVMetrics, "no-kv-metrics", false, "leave vllm:cache_config_info and the KV usage gauge out of /metrics, as older vLLM releases and vLLM-compatible engines")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("VLLM_API_KEY"), "require Authorization: Bearer KEY on /v1 paths, as vLLM's --api-key (default $VLLM_API_KEY)")
	fs.IntVar(&cfg.MaxLoRAs, "max-loras", 0, "distinct LoRA adapters in the running batch; others wait deferred (0: no bound)")
	fs.Float64Var(&cfg.Faults.ErrorRate, "fault-error-rate", 0, "chance of an error before the stream")
	fs.IntVar(&cfg.Faults.ErrorStatus, "fault-error-status", d.Faults.ErrorStatus, "status of injected errors")
	fs.Float64Var(&cfg.Faults.SpikeRate, "fault-spike-rate", 0, "chance of a latency spike per step")
	fs.DurationVar(&cfg.Faults.Spike, "fault-spike", 0, "length of a latency spike")
	fs.Float64Var(&cfg.Faults.DropRate, "fault-drop-rate", 0, "chance of a connection cut mid-stream")
	fs.Float64Var(&cfg.Faults.StreamErrorRate, "fault-stream-error-rate", 0, "chance of an SSE error event mid-stream")
	fs.DurationVar(&cfg.Faults.StartupDelay, "startup-delay", 0, "open the ports this late")
	fs.Float64Var(&cfg.Faults.StallRate, "stall-rate", 0, "chance per step that the engine stalls")
	fs.DurationVar(&cfg.Faults.Stall, "stall", 0, "length of a stall")
	fs.DurationVar(&cfg.Faults.DeadAfter, "dead-after", 0, "engine dies this long after start (0: never)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *replicas < 1 {
		return usagef("--replicas must be >= 1, got %d", *replicas)
	}
	if err := cfg.Validate(); err != nil {
		return usagef("%v", err)
	}
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		return usagef("--listen %q: %v", *listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port+*replicas-1 > 65535 {
		return usagef("--listen %q: port must be a number in 0..%d", *listen, 65536-*replicas)
	}

	if d := cfg.Faults.StartupDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		cfg.Faults.StartupDelay = 0
	}
	lns := make([]net.Listener, 0, *replicas)
	closeAll := func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}
	reps := make([]*sim.Replica, 0, *replicas)
	for i := range *replicas {
		p := port
		if port != 0 {
			p = port + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			closeAll()
			return fmt.Errorf("replica %d: %w", i, err)
		}
		lns = append(lns, ln)
		c := cfg
		c.ReplicaIndex = i
		r, err := sim.New(c)
		if err != nil {
			closeAll()
			return usagef("%v", err)
		}
		reps = append(reps, r)
	}
	for i, ln := range lns {
		fmt.Fprintf(e.stdout, "sim replica %d listening on http://%s (model %s)\n", i, ln.Addr(), cfg.Model)
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, r := range reps {
		ln := lns[i]
		g.Go(func() error { return r.Serve(gctx, ln) })
	}
	return g.Wait()
}
