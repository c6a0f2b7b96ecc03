// Package sim is a vLLM simulator: an OpenAI-compatible HTTP server backed
// by a simulated continuous-batching engine, shaped like vLLM's (see
// docs/VLLM.md part 3). It stands in for vLLM in tests, the demo and
// GPU-less benchmarks.
//
// # Model
//
// A [Replica] is one simulated vLLM server: an [http.Handler] plus one engine
// goroutine started by [Replica.Run]. HTTP handlers parse and validate a
// request (vLLM's 400/404 come before queueing), then hand one sequence per
// choice (n per prompt) to the engine and wait for its tokens. What vLLM's
// engine checks when it adds a request (logprobs over MaxLogprobs, a bad
// JSON schema, an out-of-vocabulary token id, a chat prompt of exactly
// max_model_len, MaxNumQueuedReqs over waiting + running) reaches a
// streamed request after its 200 headers, as an SSE error event then
// [DONE], and a non-streamed one as its response. The chat role chunk goes
// out with the first token.
//
// The engine steps a batch, like vLLM's scheduler:
//   - at most MaxNumSeqs sequences run; the rest wait (FCFS, or priority
//     then arrival under SchedulingPolicy "priority");
//   - a running sequence holds KV blocks for prompt + generated tokens; a
//     waiting one is admitted only if its prompt (plus what it had generated
//     before a preemption) fits, or with MaxNumBatchedTokens its first
//     prefill chunk (vLLM v1); when a step is short of KV the newest (or
//     worst-priority) running sequence is preempted: its KV is freed and it
//     goes back to the front of the queue, to be recomputed;
//   - with MaxLoRAs, a waiting request whose LoRA adapter would make the
//     running batch's distinct adapters exceed it is skipped (counted
//     "deferred" in vllm:num_requests_waiting_by_reason) and those behind it
//     may run;
//   - a step lasts DecodeStep + DecodeStepPerSeq × decoding sequences +
//     prompt tokens prefilled in the step / PrefillTPS. A newly admitted
//     sequence gets its first token at the end of its prefill step, then one
//     token per step.
//
// Config.APIKey guards the /v1 paths as vLLM's --api-key; Config.NoKVMetrics
// drops vllm:cache_config_info and the KV usage gauge, as servers that lack
// them (see docs/VLLM.md §1.7 and §1.7a).
//
// Aborts: an HTTP handler sees its client go through the request context
// (net/http notices a closed connection without a write, as uvicorn does for
// vLLM). The sequence is then dropped at the end of the current step at the
// latest, which frees its slot and KV; it produces no further token.
//
// # Invariants
//
//   - Every token the engine generates is counted once in
//     vllm:generation_tokens_total and in Stats.GenerationTokens; a finished
//     request's usage.completion_tokens equals the tokens generated for it.
//   - /tokenize's count equals usage.prompt_tokens for the same input: both
//     use the simulator's tokenizer (split on whitespace, cut words into
//     pieces of at most 4 bytes), and output is made of one-token words.
//   - sim_gpu_busy_seconds_total is the sum of step durations (simulated
//     time); idle time, when no sequence runs, is excluded.
//   - sim_gpu_energy_joules_total is exactly 70 W × time since start +
//     630 W × busy time (power.go), so that energy attribution can be
//     checked against it.
//
// # Determinism
//
// Output lengths, texts and per-request faults come from a random stream
// keyed by Config.Seed, Config.ReplicaIndex and the request id (X-Request-Id,
// else a hash of the body), so they do not depend on arrival order. Step
// faults (spikes, stalls) come from the engine's own seeded stream. Timings
// are exact only under a fake clock (testing/synctest, or Config.Clock).
//
// # Usage
//
// In a test, a replica on a loopback port takes three lines:
//
//	r, err := sim.New(sim.DefaultConfig())
//	ln, err := net.Listen("tcp", "127.0.0.1:0")
//	go func() { done <- r.Serve(ctx, ln) }() // returns nil once ctx ends
//
// then [Replica.Stats] reads its counters (requests received, running,
// waiting, aborted, tokens, preemptions, busy time). Inside a
// testing/synctest bubble, call [Replica.Run] and drive [Replica.Handler]
// directly (a goroutine blocked on a real socket is not durably blocked).
//
// # Design rationale
//
// Each replica owns a Prometheus registry instead of taking a Registerer:
// its /metrics must show exactly what one vLLM server shows, and several
// replicas in one process would collide on names and labels in a shared
// one. [Replica.Gatherer] exposes it.
//
// The engine keeps steps on absolute deadlines (a step starts when the
// previous one was due to end, up to 50ms behind), so the engine's own
// work and goroutine wake-up delays do not stretch simulated GPU time.
//
// # Concurrency
//
// A Replica is safe for concurrent use. The engine goroutine owns the batch;
// handlers talk to it through a mutex-guarded inbox and per-request atomics
// and a size-1 notification channel. No goroutine outlives Run or Serve.
package sim
