package node

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// logBuffer collects a node's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// oneReplicaYAML is a config for one replica at url with extra keys on its
// entry.
func oneReplicaYAML(url, replicaExtra string) string {
	return fmt.Sprintf(`upstream:
  scrape_interval: 50ms
  replicas:
    - {name: r0, url: %q%s}
gpu: {telemetry: off}
server: {drain_timeout: 5s}
tenants:
  - name: acme
    api_keys: [%q]
`, url, replicaExtra, config.HashKey(keyAcme))
}

// adminGet reads an admin-listener path with the admin token.
func (n *node) adminGet(t *testing.T, path string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, n.adminURL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+keyAdmin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return string(readAll(t, resp))
}

// TestKeyedReplicaFromFile: a replica started with --api-key is served
// once Sluice holds its key. With a wrong key in api_key_file its /health
// and /metrics (which vLLM leaves open) answer, so it is up, but requests
// fail and the log says the credential is refused; a reload re-reads the
// file, and requests pass. The key never appears in the log, the admin
// API, the status page or /metrics.
func TestKeyedReplicaFromFile(t *testing.T) {
	const key, wrong = "sk-replica-file-key-7f3a", "sk-stale-key-0000"
	sc := sim.DefaultConfig()
	sc.APIKey = key
	rep := startSim(t, sc)
	dir := t.TempDir()
	keyFile, cfgFile := filepath.Join(dir, "r0.key"), filepath.Join(dir, "sluice.yaml")
	require.NoError(t, os.WriteFile(keyFile, []byte(wrong+"\n"), 0o600))
	text := oneReplicaYAML(rep.url, ", api_key_file: "+keyFile)
	require.NoError(t, os.WriteFile(cfgFile, []byte(text), 0o600))
	cfg, err := config.Parse([]byte(text))
	require.NoError(t, err)
	var logs logBuffer
	n := startNodeOpts(t, cfg, Options{ConfigPath: cfgFile, Log: logs.logger()})

	r := n.call(t, "/v1/chat/completions", keyAcme, chatBody)
	assert.Equal(t, 502, r.StatusCode, string(r.Body))
	eventually(t, "the refused credential logged", func() bool {
		return strings.Contains(logs.String(), "refuses Sluice's credential")
	})

	require.NoError(t, os.WriteFile(keyFile, []byte(key+"\n"), 0o600))
	st, _, body := n.adminDo(t, http.MethodPost, "/admin/reload", "")
	require.Equal(t, 200, st, string(body))
	for range 3 {
		r = n.call(t, "/v1/chat/completions", keyAcme, chatBody)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
	}
	r = n.call(t, "/v1/completions", keyAcme, `{"model":"sim-model","prompt":"hi","max_tokens":3,"stream":true}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.Equal(t, int64(4), rep.Stats().Completed)

	seen := logs.String() + n.adminGet(t, "/admin/replicas") + n.adminGet(t, "/status.json") + n.adminGet(t, "/metrics")
	assert.NotContains(t, seen, key)
	assert.NotContains(t, seen, wrong)
}

// TestKeyedReplicaFromEnv: api_key_env names the variable that holds it.
func TestKeyedReplicaFromEnv(t *testing.T) {
	const key = "sk-replica-env-key-91c2"
	t.Setenv("SLUICE_TEST_R0_KEY", key)
	sc := sim.DefaultConfig()
	sc.APIKey = key
	rep := startSim(t, sc)
	cfg, err := config.Parse([]byte(oneReplicaYAML(rep.url, ", api_key_env: SLUICE_TEST_R0_KEY")))
	require.NoError(t, err)
	var logs logBuffer
	n := startNodeOpts(t, cfg, Options{Log: logs.logger()})
	r := n.call(t, "/v1/chat/completions", keyAcme, chatBody)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	// /v1/models answered with the key: the model is known, so an unknown
	// one is a 404, not a wait.
	r = n.call(t, "/v1/chat/completions", keyAcme, strings.Replace(chatBody, "sim-model", "no-such-model", 1))
	assert.Equal(t, 404, r.StatusCode, string(r.Body))
	assert.NotContains(t, logs.String()+n.adminGet(t, "/admin/replicas"), key)
}

// TestReplicaWithoutKVMetrics: a replica whose metrics lack
// vllm:cache_config_info is sized on its batch: the node turns ready,
// serves, keeps at most max_num_seqs requests there (the rest wait in
// Sluice, none in vLLM's queue), says "batch" in the admin API and the
// status page, and logs why once.
func TestReplicaWithoutKVMetrics(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.NoKVMetrics, sc.MaxNumSeqs, sc.DecodeStep = true, 4, 5*time.Millisecond
	rep := startSim(t, sc)
	cfg := nodeConfig(t, []*simReplica{rep}, "", "")
	cfg.Upstream.Replicas[0].MaxNumSeqs = 4
	var logs logBuffer
	n := startNodeOpts(t, cfg, Options{Log: logs.logger()}) // waits for /readyz and a capacity

	const total = 8
	body := `{"model":"sim-model","prompt":"x","max_tokens":60,"ignore_eos":true}`
	var wg sync.WaitGroup
	codes := make([]int, total)
	for i := range total {
		wg.Go(func() { codes[i] = n.call(t, "/v1/completions", keyAcme, body).StatusCode })
	}
	eventually(t, "the batch full", func() bool { return rep.Stats().Running == 4 })
	assert.Zero(t, rep.Stats().Waiting, "Sluice keeps what does not fit the batch")
	wg.Wait()
	for i, c := range codes {
		assert.Equal(t, 200, c, "request %d", i)
	}
	assert.Equal(t, int64(total), rep.Stats().Completed)

	rows := n.replicaRows(t)
	assert.Equal(t, "batch", rows["r0"]["sizing"])
	assert.Positive(t, rows["r0"]["capacity_tokens"])
	assert.Contains(t, n.adminGet(t, "/status.json"), `"sizing":"batch"`)
	warned := strings.Count(logs.String(), "lack vllm:cache_config_info")
	assert.Equal(t, 1, warned, logs.String())
	assert.Contains(t, logs.String(), "replica=r0")
	assert.Contains(t, logs.String(), "missing_metric=vllm:cache_config_info")
}

// TestHealthOnAPIPort: GET /health on the API listener answers as vLLM's
// (200, empty body) while the node can serve, and 503 with the reason
// once it cannot.
func TestHealthOnAPIPort(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.Faults.DeadAfter = 500 * time.Millisecond
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	health := func() (int, string) {
		resp, err := http.Get(n.api + "/health")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	st, body := health()
	require.Equal(t, 200, st, body)
	assert.Empty(t, body)
	resp, err := http.Post(n.api+"/health", "text/plain", nil)
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, 405, resp.StatusCode)
	eventually(t, "/health 503", func() bool { st, _ = health(); return st == 503 })
	_, body = health()
	assert.Equal(t, "no healthy replica\n", body)
}

// TestLoRAAdapterGoesWhereResident: once a replica's
// vllm:lora_requests_info shows an adapter running there, the next request
// for it goes there although another replica is emptier; a base-model
// request still goes by load.
func TestLoRAAdapterGoesWhereResident(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.LoRAModules = []sim.LoRAModule{{Name: "ad-a", Path: "/a"}, {Name: "ad-b", Path: "/b"}}
	sc.MaxLoRAs, sc.DecodeStep = 1, 5*time.Millisecond
	reps := []*simReplica{startSim(t, sc), startSim(t, sc)}
	cfg := nodeConfig(t, reps, "", "")
	cfg.Upstream.Routing = "least_load"
	n := startNode(t, cfg)

	long := `{"model":"ad-a","prompt":"x","max_tokens":400,"ignore_eos":true}`
	var wg sync.WaitGroup
	wg.Go(func() { assert.Equal(t, 200, n.call(t, "/v1/completions", keyAcme, long).StatusCode) })
	var home string
	eventually(t, "ad-a resident on one replica", func() bool {
		for name, row := range n.replicaRows(t) {
			if res, ok := row["lora_resident"].([]any); ok && len(res) == 1 && res[0] == "ad-a" {
				home = name
				return true
			}
		}
		return false
	})
	at := map[string]*simReplica{"r0": reps[0], "r1": reps[1]}
	other := map[string]string{"r0": "r1", "r1": "r0"}[home]
	short := `{"model":"ad-a","prompt":"x","max_tokens":2}`
	r := n.call(t, "/v1/completions", keyAcme, short)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.Equal(t, int64(2), at[home].Stats().Received, "the adapter's second request joins the first")
	assert.Zero(t, at[other].Stats().Received)
	r = n.call(t, "/v1/completions", keyAcme, `{"model":"sim-model","prompt":"x","max_tokens":2}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.Equal(t, int64(1), at[other].Stats().Received, "a base-model request goes to the emptier replica")
	wg.Wait()
}
