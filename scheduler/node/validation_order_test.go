package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// Admission checks in vLLM's order: a malformed request, then one the
// model cannot take (both vLLM's 400), then the tenant's limits, then its
// budgets (429). The bytes bound only sizes holds: what is refused as too
// long, or on a token budget, is decided on the replica's exact count.

func budgetNode(t *testing.T, mml int, acmeExtra string) (*node, *simReplica) {
	t.Helper()
	sc := sim.DefaultConfig()
	sc.MaxModelLen = mml
	sc.KVTokens = 1 << 17
	sc.DecodeStep = 50 * time.Microsecond
	sc.PrefillTPS = 1e9
	rep := startSim(t, sc)
	return startNode(t, nodeConfig(t, []*simReplica{rep}, acmeExtra, "")), rep
}

// A max_tokens above the model's context is vLLM's 400, not a budget's
// 429, whatever the tenant's budget and output cap.
func TestOverContextIsInvalidBeforeAnyBudget(t *testing.T) {
	n, rep := budgetNode(t, 2048, "    max_output_tokens: 1024\n    budgets: [{dimension: tokens, limit: 100, window: 1h}]\n")
	for i, body := range []string{
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":5000}`,
		`{"model":"sim-model","prompt":"hi","max_tokens":5000}`,
	} {
		path := chatPath
		if i == 1 {
			path = cmplPath
		}
		direct := postDirect(t, rep.url+path, body, fmt.Sprint("direct-", i))
		require.Equal(t, http.StatusBadRequest, direct.StatusCode, "vLLM's answer: %s", direct.Body)
		via := n.call(t, path, keyAcme, body)
		require.Equal(t, http.StatusBadRequest, via.StatusCode, "%s", via.Body)
		code, _ := errorCode(t, via.Body)
		assert.Equal(t, "context_length_exceeded", code)
		assert.Empty(t, via.Header.Get("Retry-After"), "not retryable")
	}
}

// A prompt whose byte bound exceeds what is left of a token budget, but
// whose exact count fits, runs; one whose exact input alone does not fit is
// refused with advice that is true: no output fits, and no max_tokens helps.
func TestTokenBudgetDecidesOnTheExactCount(t *testing.T) {
	n, _ := budgetNode(t, 8192, "    budgets: [{dimension: tokens, limit: 989, window: 1h}]\n")
	prompt := diffWords(256)
	require.Greater(t, len(prompt), 989, "the byte bound alone is over the budget")
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"max_tokens":8,"ignore_eos":true}`, prompt)
	via := n.call(t, chatPath, keyAcme, body)
	require.Equal(t, http.StatusOK, via.StatusCode, "%s", via.Body)
	var u struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(via.Body, &u))
	used := u.Usage.PromptTokens + u.Usage.CompletionTokens
	require.Less(t, used, 989)
	assert.Equal(t, 8, u.Usage.CompletionTokens)

	// Over what is left by its exact count alone.
	big := diffWords(900)
	body = fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"max_tokens":8}`, big)
	via = n.call(t, chatPath, keyAcme, body)
	require.Equal(t, http.StatusTooManyRequests, via.StatusCode, "%s", via.Body)
	code, details := errorCode(t, via.Body)
	assert.Equal(t, "tenant_budget_exceeded", code)
	assert.Equal(t, float64(0), details["fits_output_tokens"])
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(via.Body, &e))
	assert.NotContains(t, e.Error.Message, "lower max_tokens", "no max_tokens can help when none fits")
	assert.Contains(t, e.Error.Message, "leaves no room for output: retry after the window resets")
	assert.NotContains(t, e.Error.Message, "upper bound", "counted exactly")
	assert.NotEmpty(t, via.Header.Get("Retry-After"))
}
