package node

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

const (
	keyCI  = "sk-acme-ci-bot"
	keyWeb = "sk-acme-web"
)

// keysConfig renders a config whose tenant acme has keyAcme plus the
// mapped keys ci-bot and web with the given api_keys YAML extras.
func keysConfig(t testing.TB, reps []*simReplica, ciExtra, webExtra, acmeExtra, top string) *config.File {
	t.Helper()
	var b strings.Builder
	// down_after 20: a loaded test machine must not turn a late scrape
	// into "no healthy replica" in the middle of a burst.
	b.WriteString("upstream:\n  scrape_interval: 50ms\n  down_after: 20\n  replicas:\n")
	for i, r := range reps {
		fmt.Fprintf(&b, "    - {name: r%d, url: %q}\n", i, r.url)
	}
	b.WriteString("gpu: {telemetry: off}\n")
	if !strings.Contains(top, "server:") {
		b.WriteString("server: {drain_timeout: 5s}\n")
	}
	b.WriteString(top)
	fmt.Fprintf(&b, "tenants:\n  - name: acme\n    api_keys:\n      - %q\n", config.HashKey(keyAcme))
	fmt.Fprintf(&b, "      - {hash: %q, name: ci-bot%s}\n", config.HashKey(keyCI), ciExtra)
	fmt.Fprintf(&b, "      - {hash: %q, name: web%s}\n", config.HashKey(keyWeb), webExtra)
	b.WriteString(acmeExtra)
	fmt.Fprintf(&b, "  - name: beta\n    api_keys: [%q]\n", config.HashKey(keyBeta))
	cfg, err := config.Parse([]byte(b.String()))
	require.NoError(t, err, b.String())
	return cfg
}

// 10 prompt token ids + 10 output tokens: exact, and ignore_eos makes the
// charge equal the hold.
const body20 = `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":10,"ignore_eos":true}`

// TestKeyBudgetsAreTheirOwn: two keys of one tenant with their own token
// budgets; the exhausted key gets 429 scope api_key naming the key, the
// other key and the tenant's plain key still get 200.
func TestKeyBudgetsAreTheirOwn(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, keysConfig(t, []*simReplica{rep},
		", budgets: [{dimension: tokens, limit: 40, window: 1h}]",
		", budgets: [{dimension: tokens, limit: 1000, window: 1h}]", "", ""))
	for i := range 2 {
		r := n.call(t, "/v1/completions", keyCI, body20)
		require.Equal(t, 200, r.StatusCode, "ci-bot call %d: %s", i, r.Body)
	}
	r := n.call(t, "/v1/completions", keyCI, body20)
	require.Equal(t, 429, r.StatusCode, string(r.Body))
	code, det := errorCode(t, r.Body)
	assert.Equal(t, "tenant_budget_exceeded", code)
	assert.Equal(t, "api_key", det["scope"])
	assert.Equal(t, "ci-bot", det["key"])
	assert.InDelta(t, 40.0, det["limit"], 1e-9)
	assert.InDelta(t, 0.0, det["fits_output_tokens"], 1e-9, "nothing fits")
	assert.NotContains(t, string(r.Body), keyCI, "the raw key never appears")

	for _, k := range []string{keyWeb, keyAcme} {
		r := n.call(t, "/v1/completions", k, body20)
		assert.Equal(t, 200, r.StatusCode, string(r.Body))
	}
	assert.Equal(t, int64(4), rep.Stats().Received)
	assert.InDelta(t, 2.0, n.metric(t, "sluice_api_key_admissions_total", map[string]string{"key": "ci-bot", "result": "admitted"}), 1e-9)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_api_key_admissions_total", map[string]string{"key": "ci-bot", "result": "denied"}), 1e-9)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_api_key_admissions_total", map[string]string{"key": "web", "result": "admitted"}), 1e-9)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_api_key_admissions_total", map[string]string{"key": "_unnamed", "result": "admitted"}), 1e-9)
}

// burst sends n requests at once and counts 200s and budget 429s; any
// other answer fails the test.
func burst(t *testing.T, nodes []*node, key, body string, count int) (ok, denied int64, dets []map[string]any) {
	t.Helper()
	var okN, deniedN atomic.Int64
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range count {
		n := nodes[i%len(nodes)]
		wg.Go(func() {
			<-start
			r := n.call(t, "/v1/completions", key, body)
			switch r.StatusCode {
			case 200:
				okN.Add(1)
				return
			case 429:
				if code, det := errorCodeOf(t, r.Body); code == "tenant_budget_exceeded" {
					deniedN.Add(1)
					mu.Lock()
					dets = append(dets, det)
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%d %s", r.StatusCode, strings.TrimSpace(string(r.Body))))
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	require.Empty(t, bad, "unexpected answers")
	return okN.Load(), deniedN.Load(), dets
}

// TestKeyBurstAdmitsExactly: 200 concurrent 20-token requests on one key
// against its 2,859-token budget admit exactly floor(2859/20) = 142, on the
// embedded ledger and on two instances sharing Redis. The 143rd is not cut
// to 19 tokens: its max_tokens is the client's.
func TestKeyBurstAdmitsExactly(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			rep := startSim(t, sim.DefaultConfig())
			top := ""
			if backend == "redis" {
				// A generous store timeout: this test is about exactness,
				// not about a loaded machine's Redis latency.
				top = fmt.Sprintf("ledger: {backend: redis, redis: {addrs: [%q], store_timeout: 5s}}\n", startRedis(t).addr)
			}
			cfg := func() *config.File {
				return keysConfig(t, []*simReplica{rep}, ", budgets: [{dimension: tokens, limit: 2859, window: 1h}]", "",
					"    concurrency: 16\n", top)
			}
			nodes := []*node{startNode(t, cfg())}
			if backend == "redis" {
				nodes = append(nodes, startNode(t, cfg()))
			}
			ok, denied, dets := burst(t, nodes, keyCI, body20, 200)
			assert.Equal(t, int64(142), ok)
			assert.Equal(t, int64(58), denied)
			assert.Equal(t, int64(142), rep.Stats().Received, "the replica sees exactly the admitted requests")
			for _, d := range dets {
				assert.Equal(t, "api_key", d["scope"])
				assert.Equal(t, "ci-bot", d["key"])
			}
		})
	}
}

// TestExplicitMaxTokensIsNeverLowered: max_tokens 3500 against a 3,000-token
// budget is refused with what would fit, and nothing is sent upstream.
func TestExplicitMaxTokensIsNeverLowered(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	// Worst-case holds: a hold of the cap does not fit. (With predicted
	// holds such a request runs on its prediction and is stopped at the
	// budget if it gets there: TestRunawayRequestsAreStoppedAtTheBudget.)
	n := startNode(t, nodeConfig(t, []*simReplica{rep},
		"    max_output_tokens: 4000\n    budgets: [{dimension: tokens, limit: 3000, window: 24h}]\n",
		"server: {drain_timeout: 5s, hold_prediction: {enabled: false}}\n"))
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":3500}`},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3500}`},
	} {
		r := n.call(t, tc.path, keyAcme, tc.body)
		require.Equal(t, 429, r.StatusCode, string(r.Body))
		code, det := errorCode(t, r.Body)
		assert.Equal(t, "tenant_budget_exceeded", code)
		assert.Equal(t, "tenant", det["scope"])
		fits, ok := det["fits_output_tokens"].(float64)
		require.True(t, ok, "details.fits_output_tokens: %s", r.Body)
		assert.Less(t, fits, 3000.0)
		assert.Greater(t, fits, 2900.0)
		if tc.path == "/v1/completions" {
			assert.InDelta(t, 2990.0, fits, 1e-9, "3000 minus 10 prompt tokens")
		}
		assert.Empty(t, r.Header.Get("X-Sluice-Output-Cap"))
	}
	assert.Equal(t, int64(0), rep.Stats().Received, "a refused request never reaches the replica")

	// What fits is served as asked.
	r := n.call(t, "/v1/completions", keyAcme, `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":2990,"ignore_eos":true}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.Empty(t, r.Header.Get("X-Sluice-Output-Cap"), "nothing was lowered")
}

// TestBurstOfTwentyTokenRequestsAdmits142: the burst example on a tenant
// budget, with and without a client cap: 200 requests of 20 tokens against
// 2,859 admit exactly 142 (before, the 143rd was cut to 19 tokens).
func TestBurstOfTwentyTokenRequestsAdmits142(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"explicit max_tokens", body20},
		// vLLM's completions default of 16 output tokens, which Sluice
		// injects and may lower, but not below min_output_tokens (16).
		{"injected cap", `{"model":"sim-model","prompt":[1,2,3,4],"ignore_eos":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := startSim(t, sim.DefaultConfig())
			n := startNode(t, keysConfig(t, []*simReplica{rep}, "", "",
				"    concurrency: 16\n    budgets: [{dimension: tokens, limit: 2859, window: 1h}]\n", ""))
			ok, denied, dets := burst(t, []*node{n}, keyAcme, tc.body, 200)
			assert.Equal(t, int64(142), ok)
			assert.Equal(t, int64(58), denied)
			assert.Equal(t, int64(142), rep.Stats().Received)
			for _, d := range dets {
				assert.Equal(t, "tenant", d["scope"])
				assert.Contains(t, d, "fits_output_tokens")
			}
		})
	}
}

// TestInjectedCapLoweredWithHeader: without max_tokens, near the end of a
// budget, the request is served with the lowered cap and says so.
func TestInjectedCapLoweredWithHeader(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep},
		"    budgets: [{dimension: tokens, limit: 34, window: 1h}]\n", "server: {drain_timeout: 5s, min_output_tokens: 4}\n"))
	// 4 + 16 (vLLM's completions default) = 20 tokens, served in full.
	body := `{"model":"sim-model","prompt":[1,2,3,4],"ignore_eos":true}`
	r := n.call(t, "/v1/completions", keyAcme, body)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.Empty(t, r.Header.Get("X-Sluice-Output-Cap"))
	// 14 left: 4 prompt + 10 output, lowered from 16 and said so.
	r = n.call(t, "/v1/completions", keyAcme, body)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.Equal(t, "10; reason=budget", r.Header.Get("X-Sluice-Output-Cap"))
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &out))
	assert.Equal(t, 10, out.Usage.CompletionTokens)
	// Nothing left above the floor of 4: refused, with the floor named.
	r = n.call(t, "/v1/completions", keyAcme, body)
	require.Equal(t, 429, r.StatusCode, string(r.Body))
	_, det := errorCode(t, r.Body)
	assert.InDelta(t, 0.0, det["fits_output_tokens"], 1e-9)
	assert.InDelta(t, 4.0, det["min_output_tokens"], 1e-9)
}

// TestKeyConcurrencyCap: a key with concurrency 1 runs one request at a
// time while the tenant (concurrency 8) runs others.
func TestKeyConcurrencyCap(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.DecodeStep = 20 * time.Millisecond
	rep := startSim(t, cfg)
	n := startNode(t, keysConfig(t, []*simReplica{rep}, ", concurrency: 1", "", "", ""))
	body := `{"model":"sim-model","prompt":[1,2],"max_tokens":10,"ignore_eos":true}`
	var wg sync.WaitGroup
	var peak, cur atomic.Int64
	for range 4 {
		wg.Go(func() {
			r := n.call(t, "/v1/completions", keyCI, body)
			assert.Equal(t, 200, r.StatusCode, string(r.Body))
		})
	}
	// Sample this instance's in-flight count of the tenant while the four
	// run: with only ci-bot sending, it never exceeds the key's cap.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			assert.Equal(t, int64(1), peak.Load(), "ci-bot's requests in flight at once")
			assert.Equal(t, int64(4), rep.Stats().Received)
			return
		default:
		}
		v := int64(n.metric(t, "sluice_inflight_requests", map[string]string{"tenant": "acme"}))
		cur.Store(v)
		if v > peak.Load() {
			peak.Store(v)
		}
		time.Sleep(2 * time.Millisecond) // sampling a gauge, not synchronising
	}
}

// TestRuntimeKeyFleetWide: a key created through the admin API of instance
// A of a Redis fleet works on instance B within a second; after revocation
// both answer 401. The audit trail records both changes, never the key.
func TestRuntimeKeyFleetWide(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	// Worst-case holds, so that the key's budget refuses a cap it cannot hold.
	top := fmt.Sprintf("ledger: {backend: redis, redis: {addrs: [%q], store_timeout: 5s}}\nserver: {drain_timeout: 5s, hold_prediction: {enabled: false}}\n", rds.addr)
	auditPath := t.TempDir() + "/audit.jsonl"
	cfgA := nodeConfig(t, []*simReplica{rep}, "", top+fmt.Sprintf("audit: {path: %q}\n", auditPath))
	a := startNode(t, cfgA)
	b := startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))

	code, m, raw := a.adminDo(t, "POST", "/admin/keys", `{"tenant":"acme","name":"alice","expires_in":"720h",`+
		`"budgets":[{"dimension":"tokens","limit":1000,"window":"24h"}],"concurrency":2}`)
	require.Equal(t, 200, code, string(raw))
	key, _ := m["key"].(string)
	id, _ := m["id"].(string)
	require.True(t, strings.HasPrefix(key, "sk-sluice-"), "the key is returned once: %s", raw)
	require.NotEmpty(t, id)
	assert.Equal(t, "alice", m["name"])
	assert.Equal(t, "admin", m["source"])

	// At once on A, within a second on B.
	r := a.call(t, "/v1/completions", key, body20)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	created := time.Now()
	eventually(t, "the new key works on instance B", func() bool {
		return b.call(t, "/v1/completions", key, body20).StatusCode == 200
	})
	assert.Less(t, time.Since(created), time.Second, "seen by B within a second")

	// Listed without the secret on both instances.
	for _, n := range []*node{a, b} {
		code, _, raw = n.adminDo(t, "GET", "/admin/keys?tenant=acme", "")
		require.Equal(t, 200, code)
		assert.Contains(t, string(raw), `"name":"alice"`)
		assert.Contains(t, string(raw), `"source":"config"`, "config keys are listed too")
		assert.NotContains(t, string(raw), key)
		assert.NotContains(t, string(raw), config.HashKey(key), "not even the full hash")
	}

	// The key's own budget applies (1000 tokens; 40 used).
	r = b.call(t, "/v1/completions", key, `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":990}`)
	require.Equal(t, 429, r.StatusCode, string(r.Body))
	_, det := errorCode(t, r.Body)
	assert.Equal(t, "api_key", det["scope"])
	assert.Equal(t, "alice", det["key"])
	assert.InDelta(t, 950.0, det["fits_output_tokens"], 1e-9)

	code, _, raw = a.adminDo(t, "DELETE", "/admin/keys/"+id, "")
	require.Equal(t, 200, code, string(raw))
	r = a.call(t, "/v1/completions", key, body20)
	assert.Equal(t, 401, r.StatusCode, "revocation applies at once on A: %s", r.Body)
	revoked := time.Now()
	eventually(t, "the revoked key refused on instance B", func() bool {
		return b.call(t, "/v1/completions", key, body20).StatusCode == 401
	})
	assert.Less(t, time.Since(revoked), time.Second, "B refuses within a second")
	code, _, _ = a.adminDo(t, "DELETE", "/admin/keys/"+id, "")
	assert.Equal(t, 404, code, "a second revoke finds nothing")
	// The tenant's config key is unaffected.
	assert.Equal(t, 200, b.call(t, "/v1/completions", keyAcme, body20).StatusCode)

	require.NoError(t, a.stop())
	trail, err := os.ReadFile(auditPath)
	require.NoError(t, err)
	assert.Contains(t, string(trail), `"kind":"key_create"`)
	assert.Contains(t, string(trail), `"kind":"key_revoke"`)
	assert.Contains(t, string(trail), id)
	assert.NotContains(t, string(trail), key, "the audit trail never holds the key")
}

// TestRuntimeKeyPersistsNextToJournal: with the embedded ledger the keys
// survive a restart in the journal's directory.
func TestRuntimeKeyPersistsNextToJournal(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	dir := t.TempDir()
	top := fmt.Sprintf("ledger: {journal: %q}\n", dir+"/ledger.journal")
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	code, m, raw := n.adminDo(t, "POST", "/admin/keys", `{"tenant":"beta"}`)
	require.Equal(t, 200, code, string(raw))
	key := m["key"].(string)
	require.Equal(t, 200, n.call(t, "/v1/completions", key, body20).StatusCode)
	require.NoError(t, n.stop())

	doc, err := os.ReadFile(dir + "/api-keys.json")
	require.NoError(t, err)
	assert.NotContains(t, string(doc), key, "only the hash is stored")
	assert.Contains(t, string(doc), config.HashKey(key))

	n = startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	r := n.call(t, "/v1/completions", key, body20)
	assert.Equal(t, 200, r.StatusCode, "the key survives the restart: %s", r.Body)
	r = n.call(t, "/v1/completions", keyAcme, body20)
	assert.Equal(t, 200, r.StatusCode, "config key after restart: %s", r.Body)
}

func TestRuntimeKeyBadInput(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, keysConfig(t, []*simReplica{rep}, "", "", "", ""))
	for _, tc := range []struct{ body, param string }{
		{`{}`, "tenant"},
		{`{"tenant":"nope"}`, "tenant"},
		{`{"tenant":"acme","name":"ci-bot"}`, "name"},
		{`{"tenant":"acme","name":"a b"}`, "key"},
		{`{"tenant":"acme","expires_in":"-1h"}`, "expires_in"},
		{`{"tenant":"acme","budgets":[{"dimension":"tokens","limit":1,"window":"soon"}]}`, "budgets[0].window"},
		{`{"tenant":"acme","budgets":[{"dimension":"wat","limit":1,"window":"1h"}]}`, "key"},
		{`{"tenant":"acme","extra":1}`, "body"},
	} {
		code, m, raw := n.adminDo(t, "POST", "/admin/keys", tc.body)
		assert.Equal(t, 400, code, "%s: %s", tc.body, raw)
		e, _ := m["error"].(map[string]any)
		assert.Equal(t, tc.param, e["param"], "%s: %s", tc.body, raw)
	}
	code, _, _ := n.adminDo(t, "POST", "/admin/keys", `{"tenant":"acme"}`, "wrong-token")
	assert.Equal(t, 401, code)
	code, _, _ = n.adminDo(t, "DELETE", "/admin/keys/key_000000000000", "")
	assert.Equal(t, 404, code)
}

// TestRevokedKeyLetsAdmittedRequestsFinish: revocation refuses new
// requests at once; a request admitted before it runs to completion.
func TestRevokedKeyLetsAdmittedRequestsFinish(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.DecodeStep = 20 * time.Millisecond
	rep := startSim(t, cfg)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	code, m, raw := n.adminDo(t, "POST", "/admin/keys", `{"tenant":"acme","name":"temp"}`)
	require.Equal(t, 200, code, string(raw))
	key, id := m["key"].(string), m["id"].(string)

	done := make(chan reply, 1)
	go func() {
		done <- n.call(t, "/v1/completions", key, `{"model":"sim-model","prompt":[1,2],"max_tokens":40,"ignore_eos":true}`)
	}()
	eventually(t, "the request runs upstream", func() bool { return rep.Stats().Running == 1 })
	code, _, raw = n.adminDo(t, "DELETE", "/admin/keys/"+id, "")
	require.Equal(t, 200, code, string(raw))
	assert.Equal(t, 401, n.call(t, "/v1/completions", key, body20).StatusCode, "a new request with the revoked key")

	r := <-done
	require.Equal(t, 200, r.StatusCode, "the admitted request finishes: %s", r.Body)
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &out))
	assert.Equal(t, 40, out.Usage.CompletionTokens, "in full")
}
