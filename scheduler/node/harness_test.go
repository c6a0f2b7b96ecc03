package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/promsum"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// Keys of the test tenants; the config stores only their hashes.
const (
	keyAcme  = "sk-acme-test-key"
	keyBeta  = "sk-beta-test-key"
	keyAdmin = "admin-token-for-tests"
)

// simReplica is one in-process simulated vLLM replica on loopback.
type simReplica struct {
	*sim.Replica
	url string
}

func startSim(tb testing.TB, cfg sim.Config) *simReplica {
	tb.Helper()
	return startSimWrapped(tb, cfg, nil)
}

// startSimWrapped serves a replica whose HTTP handler wrap (when set)
// wraps, e.g. to timestamp upstream aborts.
func startSimWrapped(tb testing.TB, cfg sim.Config, wrap func(http.Handler) http.Handler) *simReplica {
	tb.Helper()
	r, err := sim.New(cfg)
	require.NoError(tb, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	h := r.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	engine := make(chan error, 1)
	served := make(chan error, 1)
	go func() { engine <- r.Run(ctx) }()
	go func() { served <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		cancel()
		_ = srv.Close()
		<-served
		<-engine
	})
	return &simReplica{Replica: r, url: "http://" + ln.Addr().String()}
}

// node is a Sluice server running in process.
type node struct {
	api, adminURL string
	reg           *prometheus.Registry
	stop          func() error
}

// nodeConfig renders a config for replicas with tenant overrides appended
// to tenant acme (YAML lines indented by 4 spaces).
func nodeConfig(t testing.TB, reps []*simReplica, acmeExtra, extraTop string) *config.File {
	t.Helper()
	var b strings.Builder
	b.WriteString("upstream:\n  scrape_interval: 50ms\n  replicas:\n")
	for i, r := range reps {
		fmt.Fprintf(&b, "    - {name: r%d, url: %q}\n", i, r.url)
	}
	b.WriteString("gpu: {telemetry: off}\n")
	if !strings.Contains(extraTop, "server:") {
		b.WriteString("server: {drain_timeout: 5s}\n")
	}
	b.WriteString(extraTop)
	fmt.Fprintf(&b, "tenants:\n  - name: acme\n    api_keys: [%q]\n%s", config.HashKey(keyAcme), acmeExtra)
	fmt.Fprintf(&b, "  - name: beta\n    api_keys: [%q]\n", config.HashKey(keyBeta))
	cfg, err := config.Parse([]byte(b.String()))
	require.NoError(t, err, b.String())
	return cfg
}

func startNode(t testing.TB, cfg *config.File) *node {
	t.Helper()
	return startNodeWith(t, cfg, "")
}

// startNodeWith runs a node whose reloads read configPath.
func startNodeWith(t testing.TB, cfg *config.File, configPath string) *node {
	t.Helper()
	return startNodeOpts(t, cfg, Options{ConfigPath: configPath})
}

// startNodeOpts runs a node with o (its listeners, admin token and
// registry are the harness's).
func startNodeOpts(t testing.TB, cfg *config.File, o Options) *node {
	t.Helper()
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return startNodeOnOpts(t, cfg, o, apiLn)
}

// startNodeOn runs a node serving its API on apiLn.
func startNodeOn(t testing.TB, cfg *config.File, configPath string, apiLn net.Listener) *node {
	t.Helper()
	return startNodeOnOpts(t, cfg, Options{ConfigPath: configPath}, apiLn)
}

func startNodeOnOpts(t testing.TB, cfg *config.File, o Options, apiLn net.Listener) *node {
	t.Helper()
	if o.Clock == nil {
		if cfg.Ledger.Backend == "redis" {
			clearOfHourEdge(t) // Redis's TIME decides its windows
		} else {
			o.Clock = testClock
		}
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	n := &node{api: "http://" + apiLn.Addr().String(), adminURL: "http://" + adminLn.Addr().String(), reg: prometheus.NewRegistry()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		o.APIListener, o.AdminListener, o.AdminToken, o.Registry = apiLn, adminLn, keyAdmin, n.reg
		done <- Run(ctx, cfg, o)
	}()
	stopped := false
	n.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { require.NoError(t, n.stop()) })
	// Ready once a replica has been scraped and sized.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(n.api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 && n.metric(t, "sluice_replica_capacity_tokens", nil) > 0 {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a readiness endpoint, not synchronising a race
	}
}

// post sends a generation request with the given key and headers.
func (n *node) post(t *testing.T, path, key, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, n.api+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// reply is a response read in full; its body is closed.
type reply struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

// call posts like post and reads the whole answer. It reports failures with
// t.Errorf only, so it may run on any goroutine; StatusCode is then 0.
func (n *node) call(t *testing.T, path, key, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, n.api+path, strings.NewReader(body))
	if err != nil {
		t.Errorf("new request: %v", err)
		return reply{}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", path, err)
		return reply{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("read %s: %v", path, err)
		return reply{}
	}
	return reply{StatusCode: resp.StatusCode, Header: resp.Header, Body: b}
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// errorCode extracts error.code from a Sluice error body.
func errorCode(t *testing.T, body []byte) (code string, details map[string]any) {
	t.Helper()
	var e struct {
		Error struct {
			Code    any            `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &e), string(body))
	return fmt.Sprint(e.Error.Code), e.Error.Details
}

// errorCodeOf is errorCode for goroutines other than the test's: it
// reports a body that is not JSON with t.Errorf.
func errorCodeOf(t *testing.T, body []byte) (code string, details map[string]any) {
	t.Helper()
	var e struct {
		Error struct {
			Code    any            `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Errorf("error body: %v: %s", err, body)
		return "", nil
	}
	return fmt.Sprint(e.Error.Code), e.Error.Details
}

// metric sums the samples of name whose labels include want (histograms
// count their observations).
func (n *node) metric(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	v, err := promsum.Sum(n.reg, name, want)
	require.NoError(t, err)
	return v
}

// eventually polls cond (state owned by other processes' goroutines)
// until it holds or the bound passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 10*time.Second, what, cond)
}

// eventuallyWithin is eventually with a deadline of d.
func eventuallyWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// get fetches a path of the client API with a key.
func (n *node) get(t *testing.T, path, key string) (string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, n.api+path, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	return string(readAll(t, resp)), nil
}

// testClock is the clock of the embedded-ledger nodes the tests start: the
// runtime's, shifted so that the test binary starts just past an hour.
// Budget windows tumble on it aligned to the Unix epoch, and every window
// these tests use (1h, 24h) ends on the hour, so a test asserting exact
// committed amounts would fail if its charges straddled one (CI saw
// TestIdempotentReplayOnAnotherInstance run across 20:00 UTC and its 1h
// window show one of its two charges); on this clock none does before the
// binary has run for 59 minutes. Every node of the binary shares it, so
// nodes restarted on one journal agree on the time.
func testClock() time.Time { return time.Now().Add(testClockOffset) }

var testClockOffset = func() time.Duration {
	now := time.Now()
	return now.Truncate(time.Hour).Add(30 * time.Second).Sub(now)
}()

// hourEdgeMargin is longer than any test of this package runs on a loaded
// CI machine.
const hourEdgeMargin = 45 * time.Second

// edgeCleared holds the tests clearOfHourEdge has checked.
var edgeCleared sync.Map // testing.TB → struct{}

// clearOfHourEdge keeps a Redis-ledger test's budget windows from rolling
// over under it: they tumble on Redis's TIME, which no clock of the node
// moves. A test whose first such node starts within hourEdgeMargin of the
// hour waits for the hour to pass. Only its first start checks: the margin
// covers the whole test, and a later start that waited would roll the
// windows over between the test's first requests and its last.
func clearOfHourEdge(t testing.TB) {
	if _, done := edgeCleared.LoadOrStore(t, struct{}{}); done {
		return
	}
	t.Cleanup(func() { edgeCleared.Delete(t) })
	now := time.Now()
	next := now.Truncate(time.Hour).Add(time.Hour)
	if left := next.Sub(now); left < hourEdgeMargin {
		t.Logf("waiting %v for the hour to pass before starting a node", left.Round(time.Millisecond))
		time.Sleep(left + 100*time.Millisecond)
	}
}
