package sim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
)

// ErrAlreadyRunning is returned by a second call to [Replica.Run].
var ErrAlreadyRunning = errors.New("simulator replica already running")

// Replica is one simulated vLLM server: an HTTP handler and an engine.
// Create it with [New], serve [Replica.Handler] and call [Replica.Run] once
// (or call [Replica.Serve], which does both). Safe for concurrent use.
type Replica struct {
	cfg     Config
	clk     Clock
	reg     *prometheus.Registry
	m       *metrics
	st      *counters
	eng     *engine
	mux     *http.ServeMux
	h       http.Handler // mux behind the API key check
	created int64
	running atomic.Bool
	done    chan struct{} // closed when Run returns
}

// counters backs [Stats]; all fields are atomics.
type counters struct {
	received, rejected, admitted, completed, aborted atomic.Int64
	abortedSeqs, finishedSeqs                        atomic.Int64
	running, waiting, deferred, kvUsedBlocks         atomic.Int64
	promptTokens, genTokens, preemptions, steps      atomic.Int64
	busy                                             atomic.Int64 // nanoseconds
	prefixQueries, prefixHits                        atomic.Int64
}

// Stats is a snapshot of a replica's counters, for tests.
type Stats struct {
	// Received counts generation requests (chat and completions) that
	// reached the handler, whatever their outcome.
	Received int64
	// Rejected counts generation requests answered with an error before
	// queueing (400, 404, 503, injected errors, a dead engine).
	Rejected int64
	// Admitted counts generation requests handed to the engine.
	Admitted int64
	// Completed counts requests whose full response was written.
	Completed int64
	// Aborted counts requests dropped because their client went away (or
	// an injected drop or stream error), as sim_aborted_requests_total.
	Aborted int64
	// FinishedSeqs and AbortedSeqs count sequences (choices).
	FinishedSeqs, AbortedSeqs int64
	// Running and Waiting are sequences in the batch and in the queue;
	// Deferred is those of Waiting skipped for the LoRA budget.
	Running, Waiting, Deferred int64
	// PromptTokens counts prefilled tokens (recomputation included) and
	// prefix-cache hits, as vllm:prompt_tokens_total.
	PromptTokens int64
	// PrefixQueryTokens and PrefixHitTokens are the prefix cache's
	// lookups and hits in tokens, as vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total.
	PrefixQueryTokens, PrefixHitTokens int64
	// GenerationTokens counts generated tokens, as vllm:generation_tokens_total.
	GenerationTokens int64
	// Preemptions counts preemptions, as vllm:num_preemptions_total.
	Preemptions int64
	// Steps counts engine steps.
	Steps int64
	// BusyTime is the sum of step durations, as sim_gpu_busy_seconds_total.
	BusyTime time.Duration
	// KVBlocksUsed and KVBlocksTotal describe the KV cache.
	KVBlocksUsed, KVBlocksTotal int64
}

// New validates cfg (after defaults) and builds a replica. Like vLLM, it
// refuses a MaxModelLen that does not fit in the KV cache.
func New(cfg Config) (*Replica, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Replica{
		cfg:     cfg,
		clk:     cfg.Clock,
		reg:     prometheus.NewRegistry(),
		st:      &counters{},
		created: cfg.Clock.Now().Unix(),
		done:    make(chan struct{}),
	}
	m, err := newMetrics(&r.cfg, r.reg, r.st.busy.Load)
	if err != nil {
		return nil, err
	}
	r.m = m
	r.eng = newEngine(&r.cfg, m, r.st)
	r.mux = http.NewServeMux()
	r.mux.HandleFunc("POST /v1/chat/completions", r.handleGeneration(kindChat))
	r.mux.HandleFunc("POST /v1/completions", r.handleGeneration(kindCompletion))
	r.mux.HandleFunc("POST /tokenize", r.handleTokenize)
	r.registerEndpoints()
	r.mux.HandleFunc("GET /v1/models", r.handleModels)
	r.mux.HandleFunc("GET /health", r.handleHealth)
	r.mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	r.h = requireKey(r.cfg.APIKey, r.mux)
	return r, nil
}

// Config returns the replica's configuration, defaults applied.
func (r *Replica) Config() Config { return r.cfg }

// Handler returns the replica's HTTP API. Generation requests wait for the
// engine, so [Replica.Run] must be running for them to complete.
func (r *Replica) Handler() http.Handler { return r.h }

// Run steps the engine until ctx ends, then returns nil; in-flight handlers
// then return without completing. Call it exactly once.
func (r *Replica) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(r.done)
	return r.eng.run(ctx)
}

// Serve runs the engine and serves the API on ln until ctx ends, then
// closes ln and every connection. It calls Run, so do not call Run too.
// Faults.StartupDelay delays serving (connections wait in the backlog).
func (r *Replica) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: r.h, ReadHeaderTimeout: 10 * time.Second}
	if d := r.cfg.KeepAliveTimeout; d > 0 {
		srv.IdleTimeout = d // uvicorn's timeout_keep_alive
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(gctx) })
	g.Go(func() error {
		if d := r.cfg.Faults.StartupDelay; d > 0 {
			select {
			case <-gctx.Done():
				return ln.Close()
			case <-r.clk.After(d):
			}
		}
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		return srv.Close()
	})
	return g.Wait()
}

// Serve builds a replica from cfg and serves it on ln until ctx ends.
func Serve(ctx context.Context, cfg Config, ln net.Listener) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Serve(ctx, ln)
}

// Stats returns a snapshot of the replica's counters.
func (r *Replica) Stats() Stats {
	s := r.st
	return Stats{
		Received:          s.received.Load(),
		Rejected:          s.rejected.Load(),
		Admitted:          s.admitted.Load(),
		Completed:         s.completed.Load(),
		Aborted:           s.aborted.Load(),
		FinishedSeqs:      s.finishedSeqs.Load(),
		AbortedSeqs:       s.abortedSeqs.Load(),
		Running:           s.running.Load(),
		Waiting:           s.waiting.Load(),
		Deferred:          s.deferred.Load(),
		PromptTokens:      s.promptTokens.Load(),
		PrefixQueryTokens: s.prefixQueries.Load(),
		PrefixHitTokens:   s.prefixHits.Load(),
		GenerationTokens:  s.genTokens.Load(),
		Preemptions:       s.preemptions.Load(),
		Steps:             s.steps.Load(),
		BusyTime:          time.Duration(s.busy.Load()),
		KVBlocksUsed:      s.kvUsedBlocks.Load(),
		KVBlocksTotal:     int64(r.eng.totalBlocks),
	}
}

// Gatherer exposes the replica's metrics registry (what /metrics serves).
func (r *Replica) Gatherer() prometheus.Gatherer { return r.reg }
