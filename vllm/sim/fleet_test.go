package sim

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm"
)

// TestAPIKeyGuardsV1Only: as vLLM's AuthenticationMiddleware
// (vllm/entrypoints/openai/server_utils.py), /v1 paths need the bearer key
// (scheme in any case) and answer 401 {"error":"Unauthorized"} without it;
// /health, /metrics and /tokenize do not.
func TestAPIKeyGuardsV1Only(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.APIKey = "sim-key"
	_, url := startReplica(t, cfg)
	do := func(method, path, auth, body string) (int, string) {
		req, err := http.NewRequest(method, url+path, strings.NewReader(body))
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	gen := `{"model":"sim-model","prompt":"hi","max_tokens":2}`
	for _, auth := range []string{"", "Bearer wrong", "Basic sim-key", "Bearer sim-key2", "sim-key"} {
		st, body := do(http.MethodGet, "/v1/models", auth, "")
		assert.Equal(t, 401, st, auth)
		assert.JSONEq(t, `{"error":"Unauthorized"}`, body)
		st, _ = do(http.MethodPost, "/v1/completions", auth, gen)
		assert.Equal(t, 401, st, auth)
	}
	for _, auth := range []string{"Bearer sim-key", "bearer sim-key"} {
		st, _ := do(http.MethodGet, "/v1/models", auth, "")
		assert.Equal(t, 200, st, auth)
		st, _ = do(http.MethodPost, "/v1/completions", auth, gen)
		assert.Equal(t, 200, st, auth)
	}
	st, _ := do(http.MethodGet, "/health", "", "")
	assert.Equal(t, 200, st)
	st, _ = do(http.MethodGet, "/metrics", "", "")
	assert.Equal(t, 200, st)
	st, _ = do(http.MethodPost, "/tokenize", "", `{"model":"sim-model","prompt":"hi"}`)
	assert.Equal(t, 200, st)
	st, _ = do(http.MethodOptions, "/v1/models", "", "")
	assert.NotEqual(t, 401, st)
}

// TestNoKVMetrics: the KV metrics are left out; the rest stays.
func TestNoKVMetrics(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.NoKVMetrics = true
	r, err := New(cfg)
	require.NoError(t, err)
	f := scrapeGatherer(t, r)
	assert.NotContains(t, f, "vllm:cache_config_info")
	assert.NotContains(t, f, "vllm:kv_cache_usage_perc")
	assert.Contains(t, f, "vllm:num_requests_running")
	assert.Contains(t, f, "vllm:num_requests_waiting")
	assert.Contains(t, f, "vllm:num_requests_waiting_by_reason")

	cfg.NoKVMetrics = false
	r, err = New(cfg)
	require.NoError(t, err)
	f = scrapeGatherer(t, r)
	assert.Contains(t, f, "vllm:cache_config_info")
	assert.Contains(t, f, "vllm:kv_cache_usage_perc")
}

// TestLoRABudgetDefers: with --max-loras 1, a request for a second
// adapter waits "deferred" while the first runs, and requests behind it
// for the running adapter are admitted past it; lora_requests_info's
// newest series names the running and the waiting adapters, and
// Sluice's parser reads them back.
func TestLoRABudgetDefers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.LoRAModules = []LoRAModule{{Name: "ad-a", Path: "/a"}, {Name: "ad-b", Path: "/b"}}
		cfg.MaxLoRAs = 1
		cfg.DecodeStep = 10 * time.Millisecond
		b := newIdleBubble(t, cfg)
		body := func(model string) string {
			return fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":20,"ignore_eos":true,"stream":true}`, model)
		}
		b.do(t.Context(), "/v1/completions", body("ad-a"), "a1")
		synctest.Wait()
		b.do(t.Context(), "/v1/completions", body("ad-b"), "b1")
		synctest.Wait()
		b.do(t.Context(), "/v1/completions", body("ad-a"), "a2")
		synctest.Wait()
		b.start()
		time.Sleep(25 * time.Millisecond) // a few steps, inside the bubble
		synctest.Wait()
		st := b.r.Stats()
		assert.Equal(t, int64(2), st.Running, "both ad-a requests run")
		assert.Equal(t, int64(1), st.Waiting)
		assert.Equal(t, int64(1), st.Deferred, "ad-b waits for a LoRA slot")

		text := metricsText(t, b.r)
		m := vllm.ParseMetrics(text, "sim-model")
		assert.Equal(t, 1.0, m.WaitingDeferred.V)
		assert.Equal(t, 0.0, m.WaitingCapacity.V)
		assert.Equal(t, []string{"ad-a"}, m.LoRARunning)
		assert.Equal(t, []string{"ad-b"}, m.LoRAWaiting)
		assert.Equal(t, 1.0, m.MaxLoRA.V)

		waitCompleted(b, 3) // ad-b runs once ad-a's requests are done
		m = vllm.ParseMetrics(metricsText(t, b.r), "sim-model")
		assert.Equal(t, 0.0, m.WaitingDeferred.V)
		assert.Empty(t, m.LoRAWaiting)
		b.stop()
	})
}

// metricsText is what GET /metrics serves.
func metricsText(t *testing.T, r *Replica) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	req, err := http.NewRequest(http.MethodGet, "/metrics", nil)
	require.NoError(t, err)
	r.Handler().ServeHTTP(rec, req)
	require.Equal(t, 200, rec.Code)
	return rec.Body.Bytes()
}
