package openaie2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/promsum"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/node"
	"github.com/sluicehq/sluice/vllm/sim"
)

// Keys of the test tenants; the config stores only their hashes.
const (
	keyAcme    = "sk-openai-node-acme"
	keyLimited = "sk-openai-node-limited"
	keyCapped  = "sk-openai-node-capped"
	keyAdmin   = "admin-token-for-openai-node"
)

// jsDir holds the JS tests, relative to this package.
const jsDir = "../openai-node"

// minNodeMajor is the oldest Node.js the pinned openai package supports.
const minNodeMajor = 20

func TestOfficialOpenAINodeClient(t *testing.T) {
	nodeBin := requireNode(t)
	ensureNodeModules(t)

	scfg := sim.DefaultConfig()
	scfg.DecodeStep = 10 * time.Millisecond // slow enough to cancel mid-stream
	scfg.OutputLenMax = 200
	rep, repURL := startSim(t, scfg)
	n := startNode(t, nodeConfig(t, repURL))

	files, err := filepath.Glob(filepath.Join(jsDir, "*.test.js"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no *.test.js in %s", jsDir)
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, append([]string{"--test", "--test-reporter=spec", "--test-concurrency=1"}, files...)...)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(),
		"SLUICE_BASE_URL="+n.api+"/v1",
		"SLUICE_API_KEY="+keyAcme,
		"SLUICE_LIMITED_KEY="+keyLimited,
		"SLUICE_CAPPED_KEY="+keyCapped,
		"SLUICE_METRICS_URL="+n.admin+"/metrics",
		"SLUICE_MODEL="+scfg.Model,
		"SLUICE_DIRECT_URL="+repURL+"/v1",
		"NO_COLOR=1",
	)
	out := &lineLogger{t: t, prefix: "node: "}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	out.flush()
	require.NoError(t, runErr, "node --test in test/openai-node failed (its output is above)")

	// The cancelled stream was aborted upstream, and nothing still runs.
	// The cancelled stream and capped's call stopped at its budget were
	// aborted upstream, and nothing still runs.
	eventually(t, "the simulator aborts the cancelled stream and the stopped call", func() bool {
		s := rep.Stats()
		return s.Aborted == 2 && s.Running == 0
	})
	s := rep.Stats()
	// Generations that reached the replica: acme's non-streamed, streamed
	// and cancelled calls, limited's first call and capped's call; the 429s
	// never do. The three transparency cases each send one request through
	// Sluice and one directly; the out-of-range logprobs pair is refused by
	// vLLM.
	assert.Equal(t, int64(5+6), s.Received, "generation requests at the simulator")
	assert.Equal(t, int64(3+4), s.Completed, "completed generations at the simulator")
	assert.Equal(t, int64(2), s.Rejected, "the out-of-range logprobs pair")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}), 1e-9)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "budget"}), 1e-9)

	// Every hold is released and usage was settled (the ledger gauges are
	// exported once a second).
	eventually(t, "token holds released and usage committed", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}) > 0
	})
	assert.InDelta(t, 0.0, n.metric(t, "sluice_inflight_requests", nil), 1e-9)

	// The SDK (maxRetries 2) sent the refused call once: the limited tenant
	// made exactly two requests, one served and one refused.
	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"limited served", "sluice_requests_total", map[string]string{"tenant": "limited", "outcome": "ok"}, 1},
		{"limited refused", "sluice_requests_total", map[string]string{"tenant": "limited", "outcome": "rejected"}, 1},
		{"limited all outcomes", "sluice_requests_total", map[string]string{"tenant": "limited"}, 2},
		{"limited budget rejections", "sluice_rejections_total", map[string]string{"tenant": "limited", "reason": "tenant_budget_exceeded"}, 1},
		{"limited all rejections", "sluice_rejections_total", map[string]string{"tenant": "limited"}, 1},
		{"acme served", "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "ok"}, 2 + 2},
		{"acme refused by vLLM", "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "upstream_error"}, 1},
		{"acme cancelled", "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "cancelled"}, 1},
		{"acme rejections", "sluice_rejections_total", map[string]string{"tenant": "acme"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := n.metric(t, tc.metric, tc.labels)
			assert.InDelta(t, tc.want, got, 1e-9, "%s %v", tc.metric, tc.labels)
		})
	}
}

// requireNode returns the path of a Node.js new enough for the pinned
// openai package, or fails the test saying what is missing.
func requireNode(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found in PATH: this test drives Sluice with the official openai npm package and needs Node.js >= %d (nodejs.org or NodeSource; Debian 12's nodejs is too old)", minNodeMajor)
	}
	out, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err, "%s --version", bin)
	v := strings.TrimSpace(string(out))
	major, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(v, "v"), ".", 2)[0])
	require.NoError(t, err, "cannot parse `node --version` output %q", v)
	if major < minNodeMajor {
		t.Fatalf("%s is Node.js %s; the official openai package needs Node.js >= %d", bin, v, minNodeMajor)
	}
	return bin
}

// ensureNodeModules runs `npm ci` in test/openai-node unless node_modules
// already holds the openai version that package.json pins.
func ensureNodeModules(t *testing.T) {
	t.Helper()
	want := pinnedOpenAI(t)
	if installedOpenAI(t) == want && installedAnthropic(t) == pinnedAnthropic(t) {
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("test/openai-node/node_modules lacks openai %s and npm is not in PATH: install npm (it comes with Node.js) or run `make deps`", want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = jsDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("`npm ci` in test/openai-node failed (is the npm registry reachable? run `make deps` where it is): %v\n%s", err, tail(out, 4000))
	}
	require.Equal(t, want, installedOpenAI(t), "openai version in node_modules after npm ci")
}

func pinnedOpenAI(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(jsDir, "package.json"))
	require.NoError(t, err)
	var p struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	require.NoError(t, json.Unmarshal(b, &p))
	v := p.Dependencies["openai"]
	require.NotEmpty(t, v, "package.json pins no openai version")
	return v
}

// installedOpenAI is the openai version in node_modules, "" when none.
func installedOpenAI(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(jsDir, "node_modules", "openai", "package.json"))
	if err != nil {
		return ""
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// lineLogger writes a child process's output into the test log, a line
// at a time, as it arrives.
type lineLogger struct {
	t      *testing.T
	prefix string

	mu  sync.Mutex // guards buf
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.t.Log(l.prefix + string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log(l.prefix + string(l.buf))
		l.buf = nil
	}
}

// nodeConfig renders the config: tenant acme with room in its budgets,
// tenant limited with one request per hour.
func nodeConfig(t *testing.T, repURL string) *config.File {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "upstream:\n  scrape_interval: 50ms\n  replicas:\n    - {name: r0, url: %q}\n", repURL)
	b.WriteString("gpu: {telemetry: off}\nserver: {drain_timeout: 5s}\n")
	fmt.Fprintf(&b, "tenants:\n  - name: acme\n    api_keys: [%q]\n", config.HashKey(keyAcme))
	b.WriteString("    budgets:\n      - {dimension: tokens, limit: 100000000, window: 1h}\n")
	fmt.Fprintf(&b, "  - name: limited\n    api_keys: [%q]\n", config.HashKey(keyLimited))
	b.WriteString("    budgets: [{dimension: requests, limit: 1, window: 1h}]\n")
	fmt.Fprintf(&b, "  - name: capped\n    api_keys: [%q]\n    max_output_tokens: 4000\n", config.HashKey(keyCapped))
	b.WriteString("    budgets: [{dimension: tokens, limit: 600, window: 24h}]\n")
	cfg, err := config.Parse([]byte(b.String()))
	require.NoError(t, err, b.String())
	return cfg
}

func startSim(t *testing.T, cfg sim.Config) (*sim.Replica, string) {
	t.Helper()
	r, err := sim.New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, "http://" + ln.Addr().String()
}

// sluiceNode is a Sluice server running in process.
type sluiceNode struct {
	api, admin string
	reg        *prometheus.Registry
}

func startNode(t *testing.T, cfg *config.File) *sluiceNode {
	t.Helper()
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	n := &sluiceNode{api: "http://" + apiLn.Addr().String(), admin: "http://" + adminLn.Addr().String(), reg: prometheus.NewRegistry()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, cfg, node.Options{APIListener: apiLn, AdminListener: adminLn, AdminToken: keyAdmin, Registry: n.reg})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	// Ready once the replica has been scraped and sized.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(n.api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && n.metric(t, "sluice_replica_capacity_tokens", nil) > 0 {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice not ready after 10s: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a readiness endpoint, not synchronising a race
	}
}

// metric sums the samples of name whose labels include want (histograms
// count their observations).
func (n *sluiceNode) metric(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	v, err := promsum.Sum(n.reg, name, want)
	require.NoError(t, err)
	return v
}

// eventually polls cond (state owned by the server's goroutines) until it
// holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling, not synchronising a race
	}
}

// pinnedAnthropic and installedAnthropic are the Anthropic SDK's pin in
// package.json and its version in node_modules ("" when none).
func pinnedAnthropic(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(jsDir, "package.json"))
	require.NoError(t, err)
	var p struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	require.NoError(t, json.Unmarshal(b, &p))
	return p.Dependencies["@anthropic-ai/sdk"]
}

func installedAnthropic(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(jsDir, "node_modules", "@anthropic-ai", "sdk", "package.json"))
	if err != nil {
		return ""
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
}
