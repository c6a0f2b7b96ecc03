package node

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Without an operator's max_output_tokens or a budget that limits it, a
// chat without max_tokens gets vLLM's own default: it may run to the end
// of the model's context, exactly as it would on the replica directly.
func TestUncappedChatRunsToTheContextLikeVLLM(t *testing.T) {
	n, rep := budgetNode(t, 2048, "")
	body := `{"model":"sim-model","messages":[{"role":"user","content":"write at length"}],"ignore_eos":true}`
	direct := postDirect(t, rep.url+chatPath, body, "direct")
	via := n.call(t, chatPath, keyAcme, body)
	require.Equal(t, http.StatusOK, direct.StatusCode, "%s", direct.Body)
	require.Equal(t, http.StatusOK, via.StatusCode, "%s", via.Body)
	type answer struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	var d, v answer
	require.NoError(t, json.Unmarshal(direct.Body, &d))
	require.NoError(t, json.Unmarshal(via.Body, &v))
	assert.Equal(t, 2048-d.Usage.PromptTokens, d.Usage.CompletionTokens, "vLLM runs to the end of the context")
	assert.Equal(t, d.Usage, v.Usage, "no cap of Sluice's own")
	assert.Greater(t, v.Usage.CompletionTokens, 1024)
	assert.Empty(t, via.Header.Get("X-Sluice-Output-Cap"))
}
