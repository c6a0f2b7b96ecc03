package node

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestEmbeddingBurstAdmitsFloorLimitOverCost: 20 concurrent embeddings of
// 5 token ids each against a 52-token budget: exactly floor(52/5) = 10 are
// served, the rest refused with 429 before reaching the replica, and the
// ledger charges 50 input tokens.
func TestEmbeddingBurstAdmitsFloorLimitOverCost(t *testing.T) {
	t.Parallel()
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 32\n    budgets:\n      - {dimension: tokens, limit: 52, window: 1h}\n      - {dimension: output_tokens, limit: 1000, window: 1h}\n", ""))
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := n.call(t, "/v1/embeddings", keyAcme, `{"model":"sim-model","input":[1,2,3,4,5]}`)
			if r.StatusCode == 429 {
				if code, _ := errorCodeOf(t, r.Body); code != "tenant_budget_exceeded" {
					t.Errorf("429 code %s", code)
				}
			}
			codes <- r.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	assert.Equal(t, map[int]int{200: 10, 429: 10}, got)
	assert.Equal(t, int64(10), rep.Stats().Received, "refused requests never reach the replica")
	eventually(t, "settled", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 50 &&
			n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0
	})
	assert.Zero(t, n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"}), "embeddings have no output")
}

// TestOtherEndpointsThroughSluice: every new endpoint is admitted, served
// and settled; tokenize counts only the request.
func TestOtherEndpointsThroughSluice(t *testing.T) {
	t.Parallel()
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets, ""))
	for _, tc := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"sim-model","input":"one two"}`},
		{"/pooling", `{"model":"sim-model","input":"one two"}`},
		{"/classify", `{"model":"sim-model","input":["a","b"]}`},
		{"/v1/score", `{"model":"sim-model","text_1":"q","text_2":["a","b"]}`},
		{"/rerank", `{"model":"sim-model","query":"q","documents":["a","b"]}`},
		{"/tokenize", `{"model":"sim-model","prompt":"one two"}`},
		{"/detokenize", `{"model":"sim-model","tokens":[1,2]}`},
		{"/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":4}`},
	} {
		r := n.call(t, tc.path, keyAcme, tc.body)
		assert.Equal(t, 200, r.StatusCode, "%s: %s", tc.path, r.Body)
		assert.NotEmpty(t, r.Header.Get("x-ratelimit-remaining-tokens"), tc.path)
	}
	// Charged input equals what the replica prefilled (tokenize and
	// detokenize run no model and are charged 0 tokens).
	eventually(t, "settled", func() bool {
		in := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "input_tokens"})
		return in > 0 && in == float64(rep.Stats().PromptTokens) &&
			n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0
	})
	out := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"})
	assert.True(t, out >= 1 && out <= 4, "output is the responses request's only (max_output_tokens 4), got %v", out)
	r := n.call(t, "/v1/embeddings", keyAcme, `{"model":"nope","input":"x"}`)
	assert.Equal(t, 404, r.StatusCode)
	code, _ := errorCode(t, r.Body)
	assert.Equal(t, "model_not_found", code)
	r = n.call(t, "/v1/embeddings", "", `{"model":"sim-model","input":"x"}`)
	assert.Equal(t, 401, r.StatusCode, "the new endpoints are authenticated")
	r = n.call(t, "/v1/files", keyAcme, `{}`)
	assert.Equal(t, 404, r.StatusCode, "what Sluice does not understand is not proxied")
}

// TestResponsesStreamCancelAbortsUpstream: a client that leaves a
// streamed /v1/responses mid-decode makes vLLM abort it, and the call is
// settled from what was streamed.
func TestResponsesStreamCancelAbortsUpstream(t *testing.T) {
	t.Parallel()
	sc := slowSim()
	sc.OutputLenMin = 400 // /v1/responses has no ignore_eos: the answer must outlast the cancel
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets, ""))
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"sim-model","input":"write a long story","stream":true,"max_output_tokens":500}`
	req, _ := http.NewRequestWithContext(ctx, "POST", n.api+"/v1/responses", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	readChunks(t, resp.Body, 8) // created, in_progress, item, part, 4 deltas
	cancel()
	resp.Body.Close()
	eventually(t, "simulator abort", func() bool { return rep.Stats().Aborted == 1 })
	eventually(t, "abort metric", func() bool {
		return n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}) == 1
	})
	eventually(t, "settled", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"}) > 0
	})
	out := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"})
	assert.LessOrEqual(t, out, float64(rep.Stats().GenerationTokens)+1)
	assert.GreaterOrEqual(t, out, 4.0)
	assert.Less(t, out, 500.0, "not charged the whole cap")

	// Streamed to the end: usage from response.completed.
	rr := n.call(t, "/v1/responses", keyAcme, `{"model":"sim-model","input":"hi","stream":true,"max_output_tokens":3}`)
	require.Equal(t, 200, rr.StatusCode)
	evs := sseEvents(rr.Body)
	var last struct {
		Type     string `json:"type"`
		Response struct {
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	require.NoError(t, json.Unmarshal([]byte(evs[len(evs)-1]), &last))
	assert.Equal(t, "response.completed", last.Type)
	eventually(t, "second settled", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"}) == out+float64(last.Response.Usage.OutputTokens)
	})
}

// TestCachedInputPricedSeparately: a repeated long prompt is served from
// the replica's prefix cache; its cached tokens are charged at
// cached_input_per_mtok.
func TestCachedInputPricedSeparately(t *testing.T) {
	t.Parallel()
	sc := sim.DefaultConfig()
	sc.EnablePromptTokensDetails = true
	rep := startSim(t, sc)
	top := "prices:\n  - {model: sim-model, input_per_mtok: 1000000, output_per_mtok: 0, cached_input_per_mtok: 100000}\n"
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    budgets:\n      - {dimension: usd_micros, limit: 100000000, window: 1h}\n", top))
	body := `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}],"max_tokens":1}`
	var prompt int
	for i := range 2 {
		r := n.call(t, "/v1/chat/completions", keyAcme, body)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
		var u struct {
			Usage struct {
				Prompt int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &u))
		prompt = u.Usage.Prompt
		if i == 0 {
			eventually(t, "first settled", func() bool {
				return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "usd_micros"}) == float64(prompt)
			})
		}
	}
	cached := int(rep.Stats().PrefixHitTokens)
	require.Positive(t, cached, "the second prompt hit the prefix cache")
	// 1 µUSD per input token, 0.1 per cached one, rounded up per request.
	want := float64(prompt + (prompt - cached) + (cached+9)/10)
	eventually(t, "second settled at the cached rate", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "usd_micros"}) == want
	})
}
