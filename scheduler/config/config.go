// Package config is Sluice's configuration file: the pinned YAML schema of
// ARCHITECTURE.md §3.2 plus its documented extensions, with defaults, strict
// unknown-key detection and validation that names every bad field by path.
//
// Load never half-applies: it returns a fully defaulted, validated *File or
// every problem found, joined.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/scheduler/abuse"
	"github.com/sluicehq/sluice/vllm"
)

// File is the whole configuration file.
type File struct {
	// DataDir holds the durable state under fixed names (see StatePaths).
	// Default: the config file's directory; "" keeps everything in memory
	// that no path key places elsewhere.
	DataDir string `yaml:"data_dir"`
	// Listen is the OpenAI-compatible API address. Default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// AdminListen serves the admin API and /metrics. Default 127.0.0.1:8081.
	AdminListen string   `yaml:"admin_listen"`
	Ledger      Ledger   `yaml:"ledger"`
	Upstream    Upstream `yaml:"upstream"`
	GPU         GPU      `yaml:"gpu"`
	Server      Server   `yaml:"server"`
	// Prices converts tokens to usd_micros per model; a model without a
	// price costs 0 (and a usd_micros budget then never binds for it).
	Prices  []Price  `yaml:"prices"`
	Audit   Audit    `yaml:"audit"`
	Tracing Tracing  `yaml:"tracing"`
	Admin   Admin    `yaml:"admin"`
	Global  Global   `yaml:"global"`
	Tenants []Tenant `yaml:"tenants"`

	lines lineIndex   // where Parse found each field, for Warnings
	paths *StatePaths // resolved by Load and Parse
}

// Ledger selects and tunes the budget ledger.
type Ledger struct {
	// Backend is memory (default, embedded) or redis.
	Backend string `yaml:"backend"`
	// Journal is the memory backend's durable journal; "" keeps the ledger
	// in memory only, and a restart then forgets all spend.
	Journal string `yaml:"journal"`
	// Fsync is every_op (default) or group; FsyncInterval is the group
	// commit interval (default 5ms).
	Fsync         string        `yaml:"fsync"`
	FsyncInterval time.Duration `yaml:"fsync_interval"`
	Redis         Redis         `yaml:"redis"`
	// LeaseTTL bounds how long a reservation survives without a heartbeat.
	// Default 60s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// TombstoneRetention is how long an ended request's record is kept:
	// until then a retry with its Idempotency-Key is answered from it (and
	// from the response cache), after it the key runs anew. Redis holds
	// about 330 bytes per request for it. Optional; 0 = 1h, or 4·lease_ttl
	// when longer (Retention); minimum 4·lease_ttl. Fixed when the ledger
	// opens: a reload may leave it unset but not change it.
	TombstoneRetention time.Duration `yaml:"tombstone_retention"`
	// IDKeyFile holds the secret that hashes tenant, key and workflow ids
	// before they reach the store. Instances sharing a Redis must share it.
	// Optional; default: $SLUICE_LEDGER_KEY, else a built-in key (logged).
	IDKeyFile string `yaml:"id_key_file"`
}

// Retention is TombstoneRetention, or its default where it is unset: 1h,
// or 4·LeaseTTL when that is longer.
func (l *Ledger) Retention() time.Duration {
	if l.TombstoneRetention > 0 {
		return l.TombstoneRetention
	}
	return max(time.Hour, 4*l.LeaseTTL)
}

// Redis addresses the shared ledger store.
type Redis struct {
	// Addrs: one address (standalone), several (Cluster), or Sentinels
	// when MasterName is set. Default ["127.0.0.1:6379"].
	Addrs      []string `yaml:"addrs"`
	KeyPrefix  string   `yaml:"key_prefix"` // default "sluice"
	MasterName string   `yaml:"master_name"`
	// StoreTimeout bounds each ledger call. Default 250ms.
	StoreTimeout time.Duration `yaml:"store_timeout"`
	// PasswordEnv names the environment variable holding the password.
	PasswordEnv string `yaml:"password_env"`
}

// DefaultLearnScrapeInterval is upstream.learn_scrape_interval's default.
const DefaultLearnScrapeInterval = 200 * time.Millisecond

// DefaultReserveMargin is server.reserve_margin's default (the gate's
// burstK).
const DefaultReserveMargin = 2.0

// Margin is server.reserve_margin, its default where unset.
func (s *Server) Margin() float64 {
	if s.ReserveMargin == nil {
		return DefaultReserveMargin
	}
	return *s.ReserveMargin
}

// DefaultReserveCap is server.reserve_cap's default: the whole pool may be
// kept free for the light tenants.
const DefaultReserveCap = 1.0

// Cap is server.reserve_cap, its default where unset.
func (s *Server) Cap() float64 {
	if s.ReserveCap == nil {
		return DefaultReserveCap
	}
	return *s.ReserveCap
}

// DefaultLearnRamp is upstream.learn_ramp's default.
const DefaultLearnRamp = 0.5

// Upstream lists the vLLM replicas.
type Upstream struct {
	Replicas []Replica `yaml:"replicas"`
	// Discovery finds more replicas at run time (discovery.go).
	Discovery Discovery `yaml:"discovery"`
	// TokenCount is bytes (upper bound, default) or tokenize (exact).
	TokenCount string `yaml:"token_count"`
	// ScrapeInterval is how often /metrics and /health are read. Default 1s.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// LearnScrapeInterval is how often a replica is scraped while it
	// learns its batch (busy, batch not yet learned; SCHEDULING §7). A
	// value not below ScrapeInterval turns it off. Default 200ms.
	LearnScrapeInterval time.Duration `yaml:"learn_scrape_interval"`
	// LearnRamp bounds what an unlearned replica is sent: at most this
	// fraction more sequences than a scrape has shown it run with nothing
	// waiting, at least 4 more (SCHEDULING §7, "The ramp"). 0 sends up to
	// max_num_seqs at once. Default 0.5.
	LearnRamp *float64 `yaml:"learn_ramp"`
	// TakeBackWaiting takes back into Sluice's queue the requests of
	// tenants above their fair share that wait inside a replica whose
	// batch is learned (no output yet), so that vLLM's FCFS queue never
	// holds them ahead of lighter tenants (SCHEDULING §7, "Taking back").
	// Default true.
	TakeBackWaiting *bool `yaml:"take_back_waiting"`
	// DownAfter failed scrapes in a row mark a replica down. Default 3.
	DownAfter int `yaml:"down_after"`
	// Routing picks a replica within a pool: affinity (default; the
	// replica likely to hold the longest prompt prefix in its prefix cache,
	// balanced against load) or least_load.
	Routing string `yaml:"routing"`
	// StreamInterval is the replicas' --stream-interval: the most tokens
	// one usage chunk of a stream advances by, and so what an aborted
	// choice may have generated past the last usage Sluice read. Default 1
	// (vLLM's default).
	StreamInterval int `yaml:"stream_interval"`
	// NonStreamedInterval sends a non-streamed request upstream as a
	// stream with this stream_interval, re-assembled into vLLM's body,
	// so that a client that leaves is charged what ran (within one
	// interval per choice) instead of its hold. Only requests whose
	// output cap is larger and whose members a stream carries faithfully
	// (vllm.Request.Reassemblable) go so. Default 64; 0 sends every
	// non-streamed request upstream non-streamed.
	NonStreamedInterval *int `yaml:"non_streamed_interval"`
}

// DefaultNonStreamedInterval is upstream.non_streamed_interval's default.
const DefaultNonStreamedInterval = 64

// Replica is one vLLM server.
type Replica struct {
	Name string `yaml:"name"`
	URL  string `yaml:"url"`
	// GPUs are the NVML UUIDs or indexes this replica runs on.
	GPUs []string `yaml:"gpus"`
	// CapacityTokens overrides the KV capacity read from vLLM's metrics.
	// Optional; 0 = from vllm:cache_config_info.
	CapacityTokens int64 `yaml:"capacity_tokens"`
	// MaxNumSeqs bounds the sequences Sluice keeps on the replica, as
	// vLLM's --max-num-seqs. An upper bound, not a promise: the batch the
	// replica really runs is learned from its scrapes when smaller
	// (SCHEDULING §7). Optional; default 256.
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// MaxModelLen overrides the context length read from /v1/models.
	MaxModelLen int64 `yaml:"max_model_len"`
	// Models pins and restricts the models (and LoRA adapters) routed to
	// this replica: only listed names that its /v1/models also reports are
	// routed here (the list alone until it answers). Optional; empty =
	// everything its /v1/models lists.
	Models []string `yaml:"models"`
	// PriorityScheduling says the replica runs vLLM's
	// --scheduling-policy priority: Sluice then writes each request's band
	// (the tenant's priority, or the lower X-Priority) as vLLM's "priority"
	// (lower runs first and may preempt). Optional; default false: no
	// priority is sent (a client's is never forwarded).
	PriorityScheduling bool `yaml:"priority_scheduling"`
	// APIKeyEnv names the environment variable that holds the replica's
	// API key (vLLM's --api-key), sent as "Authorization: Bearer <key>" on
	// every call to it. Optional; not together with APIKeyFile.
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKeyFile is a file that holds it (surrounding whitespace trimmed);
	// a reload reads it again, so a rotated key applies without a
	// restart. Optional.
	APIKeyFile string `yaml:"api_key_file"`
}

// APIKey reads the replica's upstream credential from APIKeyEnv or
// APIKeyFile; a zero Secret when neither is set. The error names the
// variable or file, never the key.
func (r *Replica) APIKey() (vllm.Secret, error) {
	switch {
	case r.APIKeyEnv != "" && r.APIKeyFile != "":
		return vllm.Secret{}, errors.New("set api_key_env or api_key_file, not both")
	case r.APIKeyEnv != "":
		v := strings.TrimSpace(os.Getenv(r.APIKeyEnv))
		if v == "" {
			return vllm.Secret{}, fmt.Errorf("api_key_env: environment variable %s is not set or empty", r.APIKeyEnv)
		}
		return checkKey(v, "api_key_env "+r.APIKeyEnv)
	case r.APIKeyFile != "":
		b, err := os.ReadFile(r.APIKeyFile)
		if err != nil {
			// The path error names the file and the cause, not its content.
			return vllm.Secret{}, fmt.Errorf("api_key_file: %w", err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return vllm.Secret{}, fmt.Errorf("api_key_file: %s is empty", r.APIKeyFile)
		}
		return checkKey(v, "api_key_file "+r.APIKeyFile)
	}
	return vllm.Secret{}, nil
}

// checkKey refuses a key that cannot be an HTTP header value.
func checkKey(v, from string) (vllm.Secret, error) {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c == 0x7f {
			return vllm.Secret{}, fmt.Errorf("%s: the key holds a control character (one key on one line)", from)
		}
	}
	return vllm.NewSecret(v), nil
}

// GPU tunes telemetry, sizing and GPU-ms attribution.
type GPU struct {
	// Telemetry is auto (NVML if the driver loads, else vLLM metrics),
	// nvml, vllm or off. Default auto.
	Telemetry string `yaml:"telemetry"`
	// Interval between utilisation samples. Default 100ms.
	Interval time.Duration `yaml:"interval"`
	// DegradedFactor scales a degraded replica's capacity. Default 0.5.
	DegradedFactor float64 `yaml:"degraded_factor"`
	// MaxOvercommit caps the AIMD overcommit factor. Default 2.
	MaxOvercommit float64 `yaml:"max_overcommit"`
	// MsPerInputToken and MsPerOutputToken seed the GPU-ms estimate
	// (a·input + b·output). Defaults 0.05 and 10.
	MsPerInputToken  float64 `yaml:"ms_per_input_token"`
	MsPerOutputToken float64 `yaml:"ms_per_output_token"`
	// Margin multiplies the estimate for the hold. Default 1.2.
	Margin float64 `yaml:"margin"`
}

// Server holds instance-wide limits.
type Server struct {
	// MaxBodyBytes refuses larger request bodies with 413. Default 4 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxWait caps every request's queue deadline. Default 60s.
	MaxWait time.Duration `yaml:"max_wait"`
	// MaxDepth and MaxBytes bound all queues together. Defaults 4096, 256 MiB.
	MaxDepth int   `yaml:"max_depth"`
	MaxBytes int64 `yaml:"max_bytes"`
	// DrainTimeout is how long in-flight requests may finish on SIGTERM.
	// Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Headroom is the least fraction of a pool a heavy tenant must leave
	// free while a light tenant of the pool has demand (scheduler/gate;
	// the reserve grows with the light tenants' demand peaks). Default 0.1.
	Headroom float64 `yaml:"headroom"`
	// ReserveHold is the longest a light tenant that has gone quiet keeps
	// its recent demand peak reserved (heavy tenants do not fill it): it is
	// kept for ten of the tenant's mean gaps between requests (bursts),
	// at most this long, so a tenant sending every few seconds finds room
	// after an ordinary pause. Default 2m.
	ReserveHold time.Duration `yaml:"reserve_hold"`
	// StandingQueue is how long a heavy tenant's queue must have stood
	// before its weighted share of the tenants present bounds it where
	// its arrivals read as no flood (a closed loop's arrivals are its
	// completions): until then it is let through beyond the light
	// tenants' reserve, as a burst is. Default 5s.
	StandingQueue time.Duration `yaml:"standing_queue"`
	// ReserveMargin is the light tenants' reserve's margin over their
	// recent demand peak, in standard deviations of a Poisson count of
	// that size: more keeps light tenants' bursts off a full pool, at the
	// cost of heavy tenants' throughput. It sizes the split of a replica
	// shared by several instances too, so instances that share replicas
	// set it alike. 0: the peak alone. Default 2.
	ReserveMargin *float64 `yaml:"reserve_margin"`
	// ReserveCap is the most of a pool heavy tenants leave free for the
	// light tenants (their reserve: peaks, margin, headroom, beyond what
	// they hold), as a fraction of the pool: what the light tenants'
	// isolation may cost the heavy tenants in idle sequences. 1: no cap;
	// 0: none kept. Default 1.
	ReserveCap *float64 `yaml:"reserve_cap"`
	// Cost of a request for fair share: unit tokens (w_in·in + w_out·out)
	// or gpu_ms. Defaults tokens, 1, 2.
	Cost Cost `yaml:"cost"`
	// TemplateAllowance is the per-message token allowance of the bytes
	// counter. Default 8.
	TemplateAllowance int64 `yaml:"template_allowance"`
	// MinOutputTokens is the floor below which Sluice never lowers an
	// output cap it may lower (its own injected cap, a workflow's
	// remaining output) to fit a budget; below it the request is refused.
	// Default 16.
	MinOutputTokens int64 `yaml:"min_output_tokens"`
	// ExpectedOutputTokens is the output per choice a request is expected
	// to generate when its cap allows more: replica room and the
	// fair-share cost are sized on input + min(cap, this) per choice (the
	// whole cap with ignore_eos; at least min_tokens), since vLLM admits
	// by the KV a request holds, not by its cap. Ledger holds stay the
	// worst case (the cap). Default 256.
	ExpectedOutputTokens int64 `yaml:"expected_output_tokens"`
	// HoldPrediction sizes ledger holds on recent outputs and grows them
	// as requests generate (predict.go).
	HoldPrediction HoldPrediction `yaml:"hold_prediction"`
	// MediaAllowance is the tokens the bytes counter adds per image, audio
	// or video content part, whose real count the model's processor
	// decides. Default 4096.
	MediaAllowance int64 `yaml:"media_allowance"`
	// StreamWriteTimeout bounds each write to a streaming client: a client
	// that stops reading until a write has blocked this long has its call
	// ended (upstream aborted, charged what ran, its slot and replica room
	// freed) and its connection closed. Default 30s.
	StreamWriteTimeout time.Duration `yaml:"stream_write_timeout"`
	// FairShare is the scope of weighted fair share: fleet (instances on
	// one Redis ledger exchange their tenants' service and order by the
	// fleet's counters) or local (each instance is fair among its own
	// requests). Without a Redis ledger it is local either way. Default
	// fleet.
	FairShare string `yaml:"fair_share"`
}

// Cost configures fair-share costing.
type Cost struct {
	Unit string `yaml:"unit"`
	WIn  int64  `yaml:"w_in"`
	WOut int64  `yaml:"w_out"`
}

// Price is one model's token price in micro-USD per million tokens.
type Price struct {
	Model string `yaml:"model"`
	// InputPerMTok and OutputPerMTok are micro-USD per million tokens
	// (1 USD = 1,000,000).
	InputPerMTok  int64 `yaml:"input_per_mtok"`
	OutputPerMTok int64 `yaml:"output_per_mtok"`
	// CachedInputPerMTok prices input tokens served from vLLM's prefix
	// cache (usage.prompt_tokens_details.cached_tokens). Optional; 0 =
	// cached tokens cost input_per_mtok like the rest.
	CachedInputPerMTok int64 `yaml:"cached_input_per_mtok"`
}

// Tracing exports one OpenTelemetry trace per admitted request over
// OTLP/HTTP (docs/operations.md "Tracing"). Off while Endpoint is empty.
type Tracing struct {
	// Endpoint is the collector's OTLP/HTTP base URL, e.g.
	// "http://127.0.0.1:4318" (spans go to its /v1/traces; an https URL
	// uses TLS). "" disables tracing.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the fraction of new traces recorded, in (0, 1].
	// A request whose client sent a traceparent follows that sampling
	// decision. Default 1.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name resource attribute. Default "sluice".
	ServiceName string `yaml:"service_name"`
}

// Audit configures the hash-chained audit trail.
type Audit struct {
	// Path of the JSON-lines audit file; "" disables the trail.
	Path string `yaml:"path"`
	// MaxBytes rotates the file past this size. Default 64 MiB.
	MaxBytes int64 `yaml:"max_bytes"`
}

// Admin configures the admin API's own state.
type Admin struct {
	// StateFile keeps budgets set and clamps applied through the admin API
	// across restarts (JSON, written atomically). Optional; "" keeps them
	// in memory only, and a restart returns to the config file's budgets.
	StateFile string `yaml:"state_file"`
	// StatusToken is the "sha256:<hex>" hash of a read-only token that
	// opens /status and /status.json (besides the admin token). Optional.
	StatusToken string `yaml:"status_token"`
	// KeysMaxStaleness bounds how long an instance that cannot read the
	// shared run-time keys document keeps authenticating the run-time keys
	// it last read: past it those keys get 503 key_store_stale (keys of
	// the config file still work), so a key revoked meanwhile on another
	// instance stops working here too. Default 30s; at least 1s.
	KeysMaxStaleness time.Duration `yaml:"keys_max_staleness"`
}

// Global holds fleet-wide budgets applied to every request.
type Global struct {
	Budgets []Budget `yaml:"budgets"`
}

// Tenant is one customer of the fleet.
type Tenant struct {
	Name string `yaml:"name"`
	// APIKeys are the tenant's keys: each a "sha256:<hex>" hash
	// (`sluice key hash`) or an [APIKey] mapping with its own budgets;
	// raw keys are refused.
	APIKeys []APIKey `yaml:"api_keys"`
	// Weight is the fair-share weight. Default 1.
	Weight int `yaml:"weight"`
	// Priority is the band; lower runs first. Default 0.
	Priority int `yaml:"priority"`
	// Concurrency caps in-flight requests across instances. Optional; 0
	// (the default) = no per-tenant cap: fair dispatch, not a cap, isolates
	// tenants (queue/doc.go, "Work conservation").
	Concurrency int `yaml:"concurrency"`
	// InflightTokens caps the tenant's in-flight token load. Optional; 0 = none.
	InflightTokens int64 `yaml:"inflight_tokens"`
	// MaxInputTokens per request. Default 8192.
	MaxInputTokens int64 `yaml:"max_input_tokens"`
	// MaxOutputTokens caps each request's output (per choice): a larger
	// client cap is lowered to it, and it is injected when the client
	// sends none. Optional; 0 (the default) = none: the client's cap, or
	// without one vLLM's own default (the remaining context for chat, 16
	// for completions), reaches the replica as sent.
	MaxOutputTokens int64         `yaml:"max_output_tokens"`
	Queue           TenantQueue   `yaml:"queue"`
	Budgets         []Budget      `yaml:"budgets"`
	Workflow        WorkflowLimit `yaml:"workflow_defaults"`
	// Abuse configures automatic clamps for this tenant. Optional; all
	// zero (the default) detects nothing.
	Abuse abuse.Config `yaml:"abuse"`
	// OutageAllowance lets this tenant continue, counted in process, while
	// the ledger is unreachable. Optional; zero = none.
	OutageAllowance OutageAllowance `yaml:"outage_allowance"`
	// Models restricts the tenant to these model names (and adapters);
	// others answer 404 model_not_found and /v1/models hides them.
	// Optional; empty = every model the replicas serve.
	Models []string `yaml:"models"`
	// CacheIsolation is "salt" to give the tenant's prompts a prefix-cache
	// namespace of their own: Sluice writes vLLM's cache_salt, a keyed hash
	// of the tenant (never its name), replacing any the client sent, so no
	// other tenant can hit (or time) its cached prefixes. Optional; "" (the
	// default) = the shared cache, with the client's own cache_salt passed
	// through.
	CacheIsolation string `yaml:"cache_isolation"`
}

// DefaultLIFOAfter is the standing-queue age after which a fifo queue
// serves its newest request first. Under overload arrival order serves
// every request late (each waits the whole queue) and no request meets a
// latency SLO; newest-first serves what it serves in time, and the oldest
// still wait to their own deadlines (nothing is refused early). Measured:
// BENCHMARKS.md, the dominance table (overload 2× and 3×).
const DefaultLIFOAfter = time.Second

// TenantQueue bounds a tenant's queue.
type TenantQueue struct {
	// MaxDepth queued requests. Default 256.
	MaxDepth int `yaml:"max_depth"`
	// MaxBytes of queued bodies. Default 16 MiB.
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxWait is the longest a request may queue. Default 10s.
	MaxWait time.Duration `yaml:"max_wait"`
	// Order is fifo (default) or edf.
	Order string `yaml:"order"`
	// LIFOAfter is adaptive LIFO for a fifo queue: once its oldest
	// request has waited this long (a standing queue) the newest are
	// served first, so what is served starts in time under overload while
	// the oldest wait on to their deadlines. It refuses nothing: every
	// request still waits up to its max_wait (or the client's deadline).
	// Optional; default 1s (DefaultLIFOAfter); negative (e.g. -1s) keeps
	// arrival order. Not with order edf.
	LIFOAfter time.Duration `yaml:"lifo_after"`
	// ShedAfter opts a fifo queue into shedding: when dispatch reaches a
	// request that has waited this long it is refused (503 queue_shed,
	// details.reason shed_after, Retry-After) instead of served late,
	// before its max_wait. Optional; unset (the default) keeps every
	// request until its deadline.
	ShedAfter time.Duration `yaml:"shed_after"`
}

// Budget is one windowed limit on a dimension.
type Budget struct {
	Dimension string        `yaml:"dimension"`
	Limit     int64         `yaml:"limit"`
	Window    time.Duration `yaml:"window"`
	// Mode is block (default) or warn.
	Mode string `yaml:"mode"`
	// WarnRatio sets X-Budget-Warning once used/limit passes it. Default 0.8.
	WarnRatio float64 `yaml:"warn_ratio"`
}

// WorkflowLimit is the default envelope of an X-Workflow-Id.
type WorkflowLimit struct {
	MaxCalls        int64         `yaml:"max_calls"`
	MaxInputTokens  int64         `yaml:"max_input_tokens"`
	MaxOutputTokens int64         `yaml:"max_output_tokens"`
	MaxDuration     time.Duration `yaml:"max_duration"`
	MaxUSDMicros    int64         `yaml:"max_usd_micros"`
	MaxRetries      int64         `yaml:"max_retries"`
	MaxToolCalls    int64         `yaml:"max_tool_calls"`
}

// OutageAllowance bounds what a tenant may use while the ledger is down.
type OutageAllowance struct {
	Requests int64 `yaml:"requests"`
	Tokens   int64 `yaml:"tokens"`
}

// Dimensions are the budget dimensions: the pinned schema's and gpu_joules
// (GPU energy in millijoules, an extension).
var Dimensions = []string{"requests", "input_tokens", "output_tokens", "tokens", "gpu_ms", "usd_micros", "gpu_joules"}

// maxAmount is the ledger's largest amount (2^50).
const maxAmount = int64(1) << 50

// maxFileBytes bounds a config file.
const maxFileBytes = 4 << 20

// Load reads, parses, defaults and validates a config file.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(b, filepath.Dir(path), true)
}

// Parse parses, defaults and validates config bytes. Every problem is
// reported, joined; unknown keys and wrong types name their field path.
// Bytes have no directory, so there is no default data_dir: the state
// that data_dir and the path keys do not place is kept in memory only.
func Parse(b []byte) (*File, error) { return parse(b, "", false) }

func parse(b []byte, dir string, fromFile bool) (*File, error) {
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("config is larger than %d bytes", maxFileBytes)
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, errEOF(err)) {
			return nil, errors.New("config is empty")
		}
		return nil, fmt.Errorf("config is not valid YAML: %w", err)
	}
	// Every problem is reported, not the first: the shape walk's (unknown
	// keys, wrong types), then validation of what did decode, less what a
	// shape problem already explains. Each carries its line.
	shape := checkShape(&root)
	var f File
	if err := root.Decode(&f); err != nil && len(shape) == 0 {
		return nil, fmt.Errorf("config: %w", err)
	}
	f.lines = indexLines(&root)
	f.applyDefaults()
	f.resolvePaths(dir, fromFile)
	errs := make([]error, 0, len(shape))
	for _, p := range shape {
		errs = append(errs, p)
	}
	errs = append(errs, f.lines.located(f.Validate(), shape)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &f, nil
}

func errEOF(err error) error {
	if err != nil && err.Error() == "EOF" {
		return err
	}
	return errors.New("not EOF")
}

// HashKey returns the config form of a raw API key: "sha256:<hex>".
func HashKey(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (f *File) applyDefaults() {
	def(&f.Listen, "127.0.0.1:8080")
	def(&f.AdminListen, "127.0.0.1:8081")
	l := &f.Ledger
	def(&l.Backend, "memory")
	def(&l.Fsync, "every_op")
	def(&l.FsyncInterval, 5*time.Millisecond)
	def(&l.LeaseTTL, 60*time.Second)
	if len(l.Redis.Addrs) == 0 {
		l.Redis.Addrs = []string{"127.0.0.1:6379"}
	}
	def(&l.Redis.KeyPrefix, "sluice")
	def(&l.Redis.StoreTimeout, 250*time.Millisecond)
	u := &f.Upstream
	def(&u.TokenCount, "bytes")
	def(&u.ScrapeInterval, time.Second)
	def(&u.LearnScrapeInterval, DefaultLearnScrapeInterval)
	if u.TakeBackWaiting == nil {
		v := true
		u.TakeBackWaiting = &v
	}
	if u.LearnRamp == nil {
		v := DefaultLearnRamp
		u.LearnRamp = &v
	}
	def(&u.DownAfter, 3)
	def(&u.Routing, "affinity")
	def(&u.StreamInterval, 1)
	if u.NonStreamedInterval == nil {
		v := DefaultNonStreamedInterval
		u.NonStreamedInterval = &v
	}
	u.Discovery.applyDefaults()
	for i := range u.Replicas {
		def(&u.Replicas[i].MaxNumSeqs, 256)
		if u.Replicas[i].Name == "" {
			u.Replicas[i].Name = fmt.Sprintf("r%d", i)
		}
	}
	g, gd := &f.GPU, gpu.Config{}.WithDefaults() // the gpu package owns these defaults
	def(&g.Telemetry, string(gd.Telemetry))
	def(&g.Interval, gd.PollInterval)
	def(&g.DegradedFactor, gd.DegradedFactor)
	def(&g.MaxOvercommit, gd.MaxOvercommit)
	def(&g.MsPerInputToken, gd.GPUMsPerInputToken)
	def(&g.MsPerOutputToken, gd.GPUMsPerOutputToken)
	def(&g.Margin, gd.GPUMsMargin)
	s := &f.Server
	def(&s.MaxBodyBytes, 4<<20)
	def(&s.MaxWait, 60*time.Second)
	def(&s.MaxDepth, 4096)
	def(&s.MaxBytes, 256<<20)
	def(&s.DrainTimeout, 30*time.Second)
	def(&f.Admin.KeysMaxStaleness, 30*time.Second)
	def(&s.Headroom, 0.1)
	def(&s.ReserveHold, 2*time.Minute)
	def(&s.StandingQueue, 5*time.Second)
	if s.ReserveMargin == nil {
		v := DefaultReserveMargin
		s.ReserveMargin = &v
	}
	if s.ReserveCap == nil {
		v := DefaultReserveCap
		s.ReserveCap = &v
	}
	def(&s.Cost.Unit, "tokens")
	def(&s.Cost.WIn, 1)
	def(&s.Cost.WOut, 2)
	def(&s.TemplateAllowance, 8)
	def(&s.MinOutputTokens, 16)
	def(&s.ExpectedOutputTokens, 256)
	s.HoldPrediction.applyDefaults()
	def(&s.MediaAllowance, 4096)
	def(&s.StreamWriteTimeout, 30*time.Second)
	def(&s.FairShare, "fleet")
	def(&f.Audit.MaxBytes, 64<<20)
	def(&f.Tracing.SampleRatio, 1)
	def(&f.Tracing.ServiceName, "sluice")
	for i := range f.Global.Budgets {
		f.Global.Budgets[i].applyDefaults()
	}
	for i := range f.Tenants {
		t := &f.Tenants[i]
		def(&t.Weight, 1)
		def(&t.MaxInputTokens, 8192)
		def(&t.Queue.MaxDepth, 256)
		def(&t.Queue.MaxBytes, 16<<20)
		def(&t.Queue.MaxWait, 10*time.Second)
		def(&t.Queue.Order, "fifo")
		if t.Queue.Order == "fifo" {
			def(&t.Queue.LIFOAfter, DefaultLIFOAfter)
		}
		for j := range t.Budgets {
			t.Budgets[j].applyDefaults()
		}
		for j := range t.APIKeys {
			t.APIKeys[j].applyDefaults()
		}
	}
}

func (b *Budget) applyDefaults() {
	def(&b.Mode, "block")
	def(&b.WarnRatio, 0.8)
}

// def sets *p to v when *p is the zero value.
func def[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

func validKeyHash(k string) bool {
	h, ok := strings.CutPrefix(k, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// BudgetID is the deterministic admin id of a budget: <tenant>:<dimension>:<window>.
func BudgetID(tenant string, b Budget) string {
	return tenant + ":" + b.Dimension + ":" + b.Window.String()
}
