package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const keyA = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae" // "foo"
const keyB = "sha256:fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9" // "bar"

const minimal = `
upstream:
  replicas:
    - {name: r0, url: http://127.0.0.1:8100}
tenants:
  - name: acme
    api_keys: ["` + keyA + `"]
`

func TestParseDefaults(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8080", f.Listen)
	assert.Equal(t, "127.0.0.1:8081", f.AdminListen)
	assert.Equal(t, "memory", f.Ledger.Backend)
	assert.Equal(t, 60*time.Second, f.Ledger.LeaseTTL)
	assert.Equal(t, time.Hour, f.Ledger.Retention())
	f, err = Parse([]byte("ledger: {lease_ttl: 30m}\n" + minimal))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Hour, f.Ledger.Retention(), "at least 4·lease_ttl")
	f, err = Parse([]byte("ledger: {tombstone_retention: 10m}\n" + minimal))
	require.NoError(t, err)
	assert.Equal(t, 10*time.Minute, f.Ledger.Retention())
	f, err = Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, "bytes", f.Upstream.TokenCount)
	assert.Equal(t, "auto", f.GPU.Telemetry)
	tn := f.Tenants[0]
	assert.Equal(t, 1, tn.Weight)
	assert.Equal(t, 0, tn.Concurrency, "unset: no per-tenant cap")
	assert.Equal(t, int64(8192), tn.MaxInputTokens)
	assert.Equal(t, int64(0), tn.MaxOutputTokens, "unset: no cap; the client gets vLLM's own default")
	assert.Equal(t, int64(256), f.Server.ExpectedOutputTokens)
	assert.Equal(t, 256, tn.Queue.MaxDepth)
	assert.Equal(t, 10*time.Second, tn.Queue.MaxWait)
	assert.Equal(t, DefaultLIFOAfter, tn.Queue.LIFOAfter, "unset: newest first once the queue stands a second")
	assert.Zero(t, tn.Queue.ShedAfter, "unset: no shedding before the deadline")
}

func TestPinnedExampleParses(t *testing.T) {
	t.Parallel()
	// ARCHITECTURE.md §3.2, with a real key hash.
	src := `
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:8081
ledger:
  backend: memory
  journal: ./sluice.journal
  redis: {addrs: ["127.0.0.1:6379"], key_prefix: sluice}
  lease_ttl: 60s
upstream:
  replicas:
    - {name: r0, url: http://127.0.0.1:8100}
  token_count: bytes
gpu: {telemetry: auto}
tenants:
  - name: acme
    api_keys: ["` + keyA + `"]
    weight: 1
    priority: 0
    concurrency: 8
    max_input_tokens: 8192
    max_output_tokens: 1024
    queue: {max_depth: 256, max_wait: 10s}
    budgets:
      - {dimension: tokens, limit: 1000000, window: 1h}
      - {dimension: gpu_ms, limit: 3600000, window: 24h}
      - {dimension: usd_micros, limit: 5000000, window: 720h, mode: warn}
`
	f, err := Parse([]byte(src))
	require.NoError(t, err)
	require.Len(t, f.Tenants[0].Budgets, 3)
	assert.Equal(t, "block", f.Tenants[0].Budgets[0].Mode)
	assert.Equal(t, "warn", f.Tenants[0].Budgets[2].Mode)
	assert.Equal(t, 720*time.Hour, f.Tenants[0].Budgets[2].Window)
}

// tenantWith returns a config whose only tenant has extra YAML lines.
func tenantWith(lines string) string {
	return `
upstream:
  replicas:
    - {name: r0, url: http://127.0.0.1:8100}
tenants:
  - name: acme
    api_keys: ["` + keyA + `"]
` + lines
}

func TestValidationRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string // every one must appear in the error
	}{
		{"empty", ``, []string{"config is empty"}},
		{"not yaml", "listen: [", []string{"not valid YAML"}},
		{"unknown top key", minimal + "bogus: 1\n", []string{"bogus is not a known key"}},
		{"unknown nested key", tenantWith("    queue: {depth: 3}\n"), []string{"tenants[0].queue.depth is not a known key"}},
		{"wrong type int", tenantWith("    weight: heavy\n"), []string{"tenants[0].weight must be an integer"}},
		{"wrong type list", tenantWith("    budgets: {dimension: tokens}\n"), []string{"tenants[0].budgets must be a list"}},
		{"wrong type duration", tenantWith("    queue: {max_wait: 10}\n"), []string{"tenants[0].queue.max_wait must be a duration"}},
		{"wrong type mapping", "ledger: memory\n" + minimal, []string{"ledger must be a mapping"}},
		{"key set twice", tenantWith("    weight: 1\n    weight: 2\n"), []string{"tenants[0].weight is set twice"}},
		{"negative limit", tenantWith("    budgets: [{dimension: tokens, limit: -1, window: 1h}]\n"), []string{"tenants[0].budgets[0].limit must be >= 0"}},
		{"limit over 2^50", tenantWith("    budgets: [{dimension: tokens, limit: 1125899906842625, window: 1h}]\n"), []string{"tenants[0].budgets[0].limit must be <= 2^50"}},
		{"bad dimension", tenantWith("    budgets: [{dimension: slots, limit: 1, window: 1h}]\n"), []string{"tenants[0].budgets[0].dimension must be one of"}},
		{"window too short", tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 500ms}]\n"), []string{"tenants[0].budgets[0].window must be >= 1s"}},
		{"window fractional", tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 1500ms}]\n"), []string{"window must be whole seconds"}},
		{"window too long", tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 745h}]\n"), []string{"window must be <= 744h"}},
		{"bad mode", tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 1h, mode: soft}]\n"), []string{"budgets[0].mode must be one of block, warn"}},
		{"duplicate budget", tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 1h}, {dimension: tokens, limit: 2, window: 1h}]\n"), []string{"budgets[1] duplicates tenants[0].budgets[0]"}},
		{"warn ratio", tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 1h, warn_ratio: 2}]\n"), []string{"warn_ratio must be in [0, 1]"}},
		{"zero weight", tenantWith("    weight: -1\n"), []string{"tenants[0].weight must be >= 1"}},
		{"bad priority", tenantWith("    priority: 99\n"), []string{"tenants[0].priority must be in 0..15"}},
		{"bad concurrency", tenantWith("    concurrency: -2\n"), []string{"tenants[0].concurrency must be >= 0 (0: no cap)"}},
		{"negative max input", tenantWith("    max_input_tokens: -1\n"), []string{"tenants[0].max_input_tokens must be > 0"}},
		{"bad order", tenantWith("    queue: {order: lifo}\n"), []string{"tenants[0].queue.order must be one of fifo, edf"}},
		{"negative shed_after", tenantWith("    queue: {shed_after: -1s}\n"), []string{"tenants[0].queue.shed_after must be >= 0 (0: off)"}},
		{"lifo with edf", tenantWith("    queue: {order: edf, lifo_after: 1s}\n"), []string{"tenants[0].queue.lifo_after applies to order fifo only"}},
		{"raw api key", strings.Replace(minimal, keyA, "sk-live-123", 1), []string{"tenants[0].api_keys[0] must be \"sha256:<64 hex digits>\""}},
		{"no keys", strings.Replace(minimal, `["`+keyA+`"]`, "[]", 1), []string{"tenants[0].api_keys must list at least one"}},
		{"duplicate tenant", minimal + "  - name: acme\n    api_keys: [\"" + keyB + "\"]\n", []string{"tenants[1].name \"acme\" duplicates tenants[0]"}},
		{"duplicate key", minimal + "  - name: other\n    api_keys: [\"" + keyA + "\"]\n", []string{"tenants[1].api_keys[0] duplicates tenants[0].api_keys[0]"}},
		{"reserved tenant name", strings.Replace(minimal, "name: acme", "name: _global", 1), []string{"tenants[0].name \"_global\" is reserved"}},
		{"no tenants", "upstream:\n  replicas: [{url: http://x:1}]\n", []string{"tenants must list at least one tenant"}},
		{"no replicas", "tenants: [{name: a, api_keys: [\"" + keyA + "\"]}]\n", []string{"upstream.replicas must list at least one replica"}},
		{"bad replica url", strings.Replace(minimal, "http://127.0.0.1:8100", "127.0.0.1:8100", 1), []string{"upstream.replicas[0].url must be an http(s) URL"}},
		{"duplicate replica", strings.Replace(minimal, "    - {name: r0, url: http://127.0.0.1:8100}", "    - {name: r0, url: http://127.0.0.1:8100}\n    - {name: r0, url: http://127.0.0.1:8101}", 1), []string{"upstream.replicas[1].name \"r0\" duplicates"}},
		{"bad backend", "ledger: {backend: etcd}\n" + minimal, []string{"ledger.backend must be one of memory, redis"}},
		{"bad fsync", "ledger: {fsync: sometimes}\n" + minimal, []string{"ledger.fsync must be one of every_op, group"}},
		{"short lease", "ledger: {lease_ttl: 1s}\n" + minimal, []string{"ledger.lease_ttl must be >= 3s"}},
		{"short retention", "ledger: {tombstone_retention: 3m}\n" + minimal, []string{"ledger.tombstone_retention 3m0s must be >= 4·ledger.lease_ttl (4m0s)"}},
		{"redis prefix braces", "ledger: {backend: redis, redis: {key_prefix: \"a{b}\"}}\n" + minimal, []string{"ledger.redis.key_prefix must not contain"}},
		{"bad token count", strings.Replace(minimal, "upstream:\n", "upstream:\n  token_count: guess\n", 1), []string{"upstream.token_count must be one of bytes, tokenize"}},
		{"bad telemetry", "gpu: {telemetry: dcgm}\n" + minimal, []string{"gpu.telemetry must be one of auto, nvml, vllm, off"}},
		{"bad degraded factor", "gpu: {degraded_factor: 1.5}\n" + minimal, []string{"gpu.degraded_factor must be in [0, 1]"}},
		{"bad overcommit", "gpu: {max_overcommit: 0.5}\n" + minimal, []string{"gpu.max_overcommit must be >= 1"}},
		{"bad headroom", "server: {headroom: 0.95}\n" + minimal, []string{"server.headroom must be in [0, 0.9]"}},
		{"bad cost unit", "server: {cost: {unit: dollars}}\n" + minimal, []string{"server.cost.unit must be one of tokens, gpu_ms"}},
		{"negative body limit", "server: {max_body_bytes: -1}\n" + minimal, []string{"server.max_body_bytes must be > 0"}},
		{"negative price", "prices: [{model: m, input_per_mtok: -1}]\n" + minimal, []string{"prices[0].input_per_mtok must be >= 0"}},
		{"global budget", "global: {budgets: [{dimension: usd_micros, limit: -3, window: 24h}]}\n" + minimal, []string{"global.budgets[0].limit must be >= 0"}},
		{"workflow defaults", tenantWith("    workflow_defaults: {max_calls: -1}\n"), []string{"tenants[0].workflow_defaults.max_calls must be >= 0"}},
		{"outage allowance", tenantWith("    outage_allowance: {requests: -1}\n"), []string{"tenants[0].outage_allowance.requests must be >= 0"}},
		{"tracing endpoint not a url", "tracing: {endpoint: \"127.0.0.1:4318\"}\n" + minimal, []string{"tracing.endpoint must be an http(s) URL"}},
		{"tracing sample ratio", "tracing: {endpoint: \"http://127.0.0.1:4318\", sample_ratio: 1.5}\n" + minimal, []string{"tracing.sample_ratio must be in (0, 1] (got 1.5)"}},
		{"tracing unknown key", "tracing: {endpoint: \"http://127.0.0.1:4318\", protocol: grpc}\n" + minimal, []string{"tracing.protocol is not a known key"}},
		{"every problem at once", tenantWith("    weight: -1\n    concurrency: -1\n    budgets: [{dimension: tokens, limit: -1, window: 1h}]\n"),
			[]string{"tenants[0].weight", "tenants[0].concurrency", "tenants[0].budgets[0].limit"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.src))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "read config")
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte(minimal), 0o600))
	f, err := Load(p)
	require.NoError(t, err)
	assert.Equal(t, "acme", f.Tenants[0].Name)
}

func TestHashKey(t *testing.T) {
	t.Parallel()
	assert.Equal(t, keyA, HashKey("foo"))
	assert.True(t, validKeyHash(HashKey("anything")))
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte(tenantWith("    budgets: [{dimension: tokens, limit: 1, window: 1h}]\n")))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("tenants: [[[]]]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := Parse(b)
		if err == nil && cfg == nil {
			t.Fatal("nil config without error")
		}
	})
}

// The abort-evidence keys: defaults, an explicit 0 that turns the evidence
// stream off, and refusals naming the key.
func TestEvidenceKeys(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, 1, f.Upstream.StreamInterval)
	require.NotNil(t, f.Upstream.NonStreamedInterval)
	assert.Equal(t, DefaultNonStreamedInterval, *f.Upstream.NonStreamedInterval)
	assert.Equal(t, 30*time.Second, f.Server.StreamWriteTimeout)
	cfg := strings.Replace(minimal, "upstream:\n", "upstream:\n  non_streamed_interval: 0\n  stream_interval: 4\n", 1)
	f, err = Parse([]byte("server: {stream_write_timeout: 2s}\n" + cfg))
	require.NoError(t, err)
	assert.Equal(t, 0, *f.Upstream.NonStreamedInterval, "0 sends non-streamed requests non-streamed")
	assert.Equal(t, 4, f.Upstream.StreamInterval)
	assert.Equal(t, 2*time.Second, f.Server.StreamWriteTimeout)
	for key, bad := range map[string]string{
		"upstream.non_streamed_interval": "upstream:\n  non_streamed_interval: -1\n",
		"upstream.stream_interval":       "upstream:\n  stream_interval: -2\n",
		"server.stream_write_timeout":    "upstream:\n",
	} {
		body := strings.Replace(minimal, "upstream:\n", bad, 1)
		if key == "server.stream_write_timeout" {
			body = "server: {stream_write_timeout: -1s}\n" + minimal
		}
		_, err := Parse([]byte(body))
		require.Error(t, err, key)
		assert.Contains(t, err.Error(), key)
	}
}

// upstream.learn_scrape_interval: its default, a value kept, and a
// refusal naming the key.
func TestLearnScrapeIntervalKey(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, 200*time.Millisecond, f.Upstream.LearnScrapeInterval)
	f, err = Parse([]byte(strings.Replace(minimal, "upstream:\n", "upstream:\n  learn_scrape_interval: 1s\n", 1)))
	require.NoError(t, err)
	assert.Equal(t, time.Second, f.Upstream.LearnScrapeInterval, "the scrape interval: off")
	for _, bad := range []string{"-1s", "5ms"} {
		_, err = Parse([]byte(strings.Replace(minimal, "upstream:\n", "upstream:\n  learn_scrape_interval: "+bad+"\n", 1)))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "upstream.learn_scrape_interval")
	}
}

// server.reserve_margin: its default, an explicit 0 kept (the peak
// alone), and a refusal naming the key.
func TestReserveMarginKey(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, DefaultReserveMargin, f.Server.Margin())
	for v, want := range map[string]float64{"0": 0, "3.5": 3.5} {
		f, err = Parse([]byte("server: {reserve_margin: " + v + "}\n" + minimal))
		require.NoError(t, err, v)
		assert.Equal(t, want, f.Server.Margin(), v)
	}
	for _, bad := range []string{"-1", "9"} {
		_, err = Parse([]byte("server: {reserve_margin: " + bad + "}\n" + minimal))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "server.reserve_margin", bad)
	}
	assert.Equal(t, DefaultReserveMargin, (&Server{}).Margin(), "unset, as before defaults")
}

// server.reserve_cap: its default (no cap), an explicit 0 kept (nothing
// kept free), and a refusal naming the key.
func TestReserveCapKey(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, 1.0, f.Server.Cap())
	for v, want := range map[string]float64{"0": 0, "0.1": 0.1, "1": 1} {
		f, err = Parse([]byte("server: {reserve_cap: " + v + "}\n" + minimal))
		require.NoError(t, err, v)
		assert.Equal(t, want, f.Server.Cap(), v)
	}
	for _, bad := range []string{"-0.1", "1.5"} {
		_, err = Parse([]byte("server: {reserve_cap: " + bad + "}\n" + minimal))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "server.reserve_cap", bad)
	}
	assert.Equal(t, DefaultReserveCap, (&Server{}).Cap(), "unset, as before defaults")
}

// upstream.learn_ramp and upstream.take_back_waiting: their defaults, an
// explicit 0 and false kept, and a refusal naming the ramp's key.
func TestLearnRampAndTakeBackKeys(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	require.NotNil(t, f.Upstream.LearnRamp)
	assert.Equal(t, DefaultLearnRamp, *f.Upstream.LearnRamp)
	require.NotNil(t, f.Upstream.TakeBackWaiting)
	assert.True(t, *f.Upstream.TakeBackWaiting)
	f, err = Parse([]byte(strings.Replace(minimal, "upstream:\n", "upstream:\n  learn_ramp: 0\n  take_back_waiting: false\n", 1)))
	require.NoError(t, err)
	assert.Zero(t, *f.Upstream.LearnRamp, "0 turns the ramp off")
	assert.False(t, *f.Upstream.TakeBackWaiting)
	_, err = Parse([]byte(strings.Replace(minimal, "upstream:\n", "upstream:\n  learn_ramp: -1\n", 1)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "upstream.learn_ramp")
}
