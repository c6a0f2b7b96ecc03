package sim

import (
	"errors"
	"fmt"
	"time"
)

// Disconnect behaviours for Config.OnDisconnect.
const (
	// OnDisconnectAbort aborts a request as soon as its client goes (vLLM).
	OnDisconnectAbort = "abort"
	// OnDisconnectNextWrite notices a streaming client's departure only when
	// a chunk write fails (Starlette with ASGI spec >= 2.4). Non-streamed
	// requests still abort at once, as vLLM's with_cancellation does.
	OnDisconnectNextWrite = "next-write"
	// OnDisconnectIgnore keeps generating to the end after a disconnect,
	// like a server that does not abort.
	OnDisconnectIgnore = "ignore"
)

// Scheduling policies for Config.SchedulingPolicy.
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

// Clock is the engine's time source. A nil Config.Clock is the real clock;
// inside a testing/synctest bubble the real clock is already fake.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Faults configures fault injection. Every rate is a probability in [0, 1];
// zero disables the fault. Per-request faults are drawn from the request's
// random stream, per-step faults from the engine's.
type Faults struct {
	// ErrorRate is the chance that a request gets a vLLM-shaped error before
	// any output. Default 0.
	ErrorRate float64
	// ErrorStatus is the status of those errors. Default 500.
	ErrorStatus int
	// SpikeRate is the chance that a step lasts Spike longer. Default 0.
	SpikeRate float64
	// Spike is the extra duration of a spiked step. Default 0.
	Spike time.Duration
	// DropRate is the chance that a streamed response's connection is cut
	// mid-stream, after 1 to 8 chunks drawn per request (no usage, no
	// [DONE]); the request is aborted. Default 0.
	DropRate float64
	// StreamErrorRate is the chance that a streamed response ends mid-stream
	// (after 1 to 8 chunks) with an SSE error event, then [DONE]; the request
	// is aborted. Default 0.
	StreamErrorRate float64
	// StartupDelay delays serving (Serve) by this long. Default 0.
	StartupDelay time.Duration
	// StallRate is the chance, per step, that the engine first stalls for
	// Stall producing nothing (not counted as GPU-busy); /health stays 200.
	StallRate float64
	// Stall is the length of a stall. Default 0.
	Stall time.Duration
	// DeadAfter kills the engine this long after Run starts: /health answers
	// 503, new requests 500, running ones end with an error. 0 disables.
	DeadAfter time.Duration
}

// Config configures one simulated replica. Zero fields take the defaults
// of [DefaultConfig] unless the field says otherwise.
type Config struct {
	// Model is the served model name (vLLM's --served-model-name).
	// Default "sim-model".
	Model string
	// ServedModelNames are more names for the same model (the rest of
	// vLLM's --served-model-name list). Optional.
	ServedModelNames []string
	// LoRAModules are adapters served as extra model names (vLLM's
	// --lora-modules). Optional.
	LoRAModules []LoRAModule
	// MediaTokens is the prompt tokens each media content part (image,
	// audio, video, file) adds, as a multimodal model's processor expands
	// it (vllm/entrypoints/chat_utils.py hands media parts to the
	// processor, not the tokenizer). Optional; 0 plays a text-only
	// template, which renders media parts as nothing.
	MediaTokens int
	// DisablePrefixCaching turns off automatic prefix caching (vLLM's
	// --no-enable-prefix-caching; on by default in v1). See prefixcache.go.
	DisablePrefixCaching bool
	// MaxNumSeqs bounds the running batch (sequences). Default 64.
	MaxNumSeqs int
	// MaxModelLen bounds prompt + output tokens per sequence. Default 4096,
	// or the KV cache size (whole blocks) when that is smaller.
	MaxModelLen int
	// KVTokens is the KV cache size in tokens, rounded down to whole
	// blocks. Must hold one MaxModelLen sequence. Default 65536.
	KVTokens int
	// BlockSize is the KV block size in tokens. Default 16.
	BlockSize int
	// PrefillTPS is the prefill speed in prompt tokens per second.
	// Default 200000.
	PrefillTPS float64
	// DecodeStep is the base duration of a step. Default 2ms.
	DecodeStep time.Duration
	// DecodeStepPerSeq is added to a step per decoding sequence. Default 0.
	DecodeStepPerSeq time.Duration
	// MaxNumBatchedTokens is the token budget of a step (vLLM's
	// --max-num-batched-tokens with chunked prefill): each decoding sequence
	// takes one token, prompts are prefilled in chunks of what remains, and
	// a sequence's first token comes at the end of the step that completes
	// its prefill. 0 (default): no budget, a prompt is prefilled in one step.
	MaxNumBatchedTokens int
	// StreamInterval packs up to this many tokens per streamed chunk
	// (vLLM's --stream-interval); the first token and the last are always
	// sent at once. A request's own stream_interval raises it, never lowers
	// it (vllm/entrypoints/openai/completion/protocol.py). Default 1.
	StreamInterval int
	// KeepAliveTimeout closes a keep-alive connection idle this long, as
	// uvicorn's --timeout-keep-alive (default 5s, which vLLM keeps:
	// vllm/entrypoints/openai/cli_args.py, uvicorn/config.py). Default 5s;
	// negative: never.
	KeepAliveTimeout time.Duration
	// MaxLogprobs is vLLM's --max-logprobs: larger logprobs,
	// top_logprobs or prompt_logprobs are refused by the engine's input
	// processor (vllm/v1/engine/input_processor.py). Default 20.
	MaxLogprobs int
	// EnablePromptTokensDetails emits usage.prompt_tokens_details
	// {"cached_tokens": N} as vLLM's --enable-prompt-tokens-details
	// (vllm/entrypoints/openai/completion/serving.py); N is 0 without a
	// prefix cache hit. Default false: null, as vLLM.
	EnablePromptTokensDetails bool
	// SystemFingerprint is the system_fingerprint of responses: on a
	// non-streamed response, on the final usage chunk, or on each choice's
	// last chunk when the client did not ask for usage
	// (vllm/entrypoints/openai/fingerprint.py, default mode "full"; the
	// completion/serving.py stream generator). Default
	// "vllm-sim-00000000"; "none" omits it (--fingerprint-mode none).
	SystemFingerprint string
	// OutputLenMax bounds the natural (EOS) output length; lengths are
	// uniform in [max(min_tokens,1), min(cap, OutputLenMax)]. Requests with
	// ignore_eos generate exactly the cap. Default 128.
	OutputLenMax int
	// OutputLenMin raises the natural length's lower bound (never above the
	// cap), for workloads whose answers are long. Default 0 (1 token).
	OutputLenMin int
	// SchedulingPolicy is "fcfs" or "priority". Default "fcfs"; under fcfs a
	// request's priority is ignored, as vLLM v1's scheduler does
	// (vllm/v1/core/sched/request_queue.py: FCFSRequestQueue).
	SchedulingPolicy string
	// MaxNumQueuedReqs refuses a request when waiting + running sequences
	// would exceed it (vLLM's --max-num-queued-reqs, checked when the engine
	// adds the request: a streamed request gets the 200 headers first and
	// then an SSE error event). 0: unbounded.
	MaxNumQueuedReqs int
	// MaxNumQueuedTokens answers 503 when waiting prompt tokens would exceed
	// it. 0: unbounded.
	MaxNumQueuedTokens int
	// Seed keys every random stream. Default 0 (a fixed seed).
	Seed int64
	// ReplicaIndex is this replica's number; it keys the random streams and
	// is not an engine label (engine="0" as vLLM without data parallelism).
	ReplicaIndex int
	// OnDisconnect is "abort", "next-write" or "ignore". Default "abort".
	OnDisconnect string
	// MetricsCompat emits the variants of VLLM.md §1.7 instead of the
	// current names: finish_reason label, no engine label,
	// vllm:gpu_cache_usage_perc, vllm:time_per_output_token_seconds.
	MetricsCompat bool
	// NoKVMetrics leaves vllm:cache_config_info and the KV usage gauge out
	// of /metrics, as older vLLM releases and vLLM-compatible engines do;
	// Sluice then sizes the replica on its batch (max_num_seqs).
	NoKVMetrics bool
	// APIKey, when set, is required as "Authorization: Bearer <key>" on
	// every path that starts with /v1, as vLLM's --api-key (or
	// VLLM_API_KEY): vLLM's AuthenticationMiddleware
	// (vllm/entrypoints/openai/server_utils.py) lets /health, /metrics,
	// /tokenize and the other non-/v1 paths through, and answers 401
	// {"error":"Unauthorized"} otherwise.
	APIKey string
	// MaxLoRAs bounds the distinct LoRA adapters in the running batch
	// (vLLM's --max-loras). A waiting request whose adapter would exceed
	// it is skipped for requests behind it and counted as waiting
	// "deferred" in vllm:num_requests_waiting_by_reason (vLLM's scheduler
	// skips it the same way: vllm/v1/core/sched/scheduler.py). Default 0:
	// no bound. vllm:lora_requests_info is emitted when adapters are
	// configured.
	MaxLoRAs int
	// Faults configures fault injection; the zero value injects none.
	Faults Faults
	// Clock is the engine's time source. Default: the real clock.
	Clock Clock
}

// DefaultConfig returns fast defaults for tests and the demo.
func DefaultConfig() Config {
	return Config{
		Model:             "sim-model",
		MaxNumSeqs:        64,
		MaxModelLen:       4096,
		KVTokens:          65536,
		BlockSize:         16,
		PrefillTPS:        200000,
		DecodeStep:        2 * time.Millisecond,
		StreamInterval:    1,
		KeepAliveTimeout:  5 * time.Second,
		MaxLogprobs:       20,
		SystemFingerprint: "vllm-sim-00000000",
		OutputLenMax:      128,
		SchedulingPolicy:  PolicyFCFS,
		OnDisconnect:      OnDisconnectAbort,
		Faults:            Faults{ErrorStatus: 500},
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.KVTokens == 0 {
		c.KVTokens = d.KVTokens
	}
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = d.MaxModelLen
		if c.BlockSize > 0 && c.KVTokens > 0 {
			// A small KV cache lowers the default, so that it still holds
			// one whole sequence.
			c.MaxModelLen = min(c.MaxModelLen, c.KVTokens/c.BlockSize*c.BlockSize)
		}
	}
	if c.PrefillTPS == 0 {
		c.PrefillTPS = d.PrefillTPS
	}
	if c.DecodeStep == 0 {
		c.DecodeStep = d.DecodeStep
	}
	if c.StreamInterval == 0 {
		c.StreamInterval = d.StreamInterval
	}
	if c.OutputLenMax == 0 {
		c.OutputLenMax = d.OutputLenMax
	}
	if c.KeepAliveTimeout == 0 {
		c.KeepAliveTimeout = d.KeepAliveTimeout
	}
	if c.MaxLogprobs == 0 {
		c.MaxLogprobs = d.MaxLogprobs
	}
	if c.SystemFingerprint == "" {
		c.SystemFingerprint = d.SystemFingerprint
	}
	if c.SchedulingPolicy == "" {
		c.SchedulingPolicy = d.SchedulingPolicy
	}
	if c.OnDisconnect == "" {
		c.OnDisconnect = d.OnDisconnect
	}
	if c.Faults.ErrorStatus == 0 {
		c.Faults.ErrorStatus = d.Faults.ErrorStatus
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c
}

// ErrConfig marks an invalid Config.
var ErrConfig = errors.New("invalid simulator config")

// Validate reports every problem of c (after defaults), joined, each
// wrapping [ErrConfig].
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrConfig))
	}
	if c.MaxNumSeqs < 0 {
		bad("max_num_seqs must be > 0, got %d", c.MaxNumSeqs)
	}
	if c.MaxModelLen < 0 {
		bad("max_model_len must be > 0, got %d", c.MaxModelLen)
	}
	if c.BlockSize < 0 {
		bad("block_size must be > 0, got %d", c.BlockSize)
	}
	if c.KVTokens < 0 {
		bad("kv_tokens must be > 0, got %d", c.KVTokens)
	}
	if c.BlockSize > 0 && c.MaxModelLen > 0 && c.KVTokens > 0 {
		blocks := c.KVTokens / c.BlockSize
		need := (c.MaxModelLen + c.BlockSize - 1) / c.BlockSize
		if need > blocks {
			bad("max_model_len %d exceeds the KV cache (kv_tokens %d = %d blocks of %d): vLLM refuses to start",
				c.MaxModelLen, c.KVTokens, blocks, c.BlockSize)
		}
	}
	if c.PrefillTPS < 0 {
		bad("prefill_tps must be > 0, got %g", c.PrefillTPS)
	}
	if c.DecodeStep < 0 {
		bad("decode_step must be > 0, got %s", c.DecodeStep)
	}
	if c.DecodeStepPerSeq < 0 {
		bad("decode_step_per_seq must be >= 0, got %s", c.DecodeStepPerSeq)
	}
	if c.MaxNumBatchedTokens < 0 || (c.MaxNumBatchedTokens > 0 && c.MaxNumBatchedTokens < c.MaxNumSeqs) {
		bad("max_num_batched_tokens must be 0 (no budget) or >= max_num_seqs (%d), got %d", c.MaxNumSeqs, c.MaxNumBatchedTokens)
	}
	if c.StreamInterval < 0 {
		bad("stream_interval must be > 0, got %d", c.StreamInterval)
	}
	if c.OutputLenMax < 0 {
		bad("output_len_max must be > 0, got %d", c.OutputLenMax)
	}
	if c.OutputLenMin < 0 || c.OutputLenMin > c.OutputLenMax {
		bad("output_len_min must be in [0, output_len_max (%d)], got %d", c.OutputLenMax, c.OutputLenMin)
	}
	if c.MaxLoRAs < 0 {
		bad("max_loras must be >= 0, got %d", c.MaxLoRAs)
	}
	if c.MaxNumQueuedReqs < 0 || c.MaxNumQueuedTokens < 0 {
		bad("max_num_queued_reqs and max_num_queued_tokens must be >= 0")
	}
	switch c.SchedulingPolicy {
	case PolicyFCFS, PolicyPriority:
	default:
		bad("scheduling_policy must be fcfs or priority, got %q", c.SchedulingPolicy)
	}
	switch c.OnDisconnect {
	case OnDisconnectAbort, OnDisconnectNextWrite, OnDisconnectIgnore:
	default:
		bad("on_disconnect must be abort, next-write or ignore, got %q", c.OnDisconnect)
	}
	errs = append(errs, c.validateModels()...)
	f := c.Faults
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"faults.error_rate", f.ErrorRate}, {"faults.spike_rate", f.SpikeRate},
		{"faults.drop_rate", f.DropRate}, {"faults.stream_error_rate", f.StreamErrorRate},
		{"faults.stall_rate", f.StallRate},
	} {
		if r.v < 0 || r.v > 1 || r.v != r.v {
			bad("%s must be in [0, 1], got %g", r.name, r.v)
		}
	}
	if f.ErrorStatus < 400 || f.ErrorStatus > 599 {
		bad("faults.error_status must be a 4xx or 5xx status, got %d", f.ErrorStatus)
	}
	if f.Spike < 0 || f.Stall < 0 || f.StartupDelay < 0 || f.DeadAfter < 0 {
		bad("fault durations must be >= 0")
	}
	return errors.Join(errs...)
}
