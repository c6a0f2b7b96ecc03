package node

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

const chatBody = `{"model":"sim-model","messages":[{"role":"user","content":"hello there general kenobi"}],"max_tokens":12}`

func TestNonStreamedMatchesDirect(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))

	via := n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Request-Id", "same-id-1")
	viaBody := readAll(t, via)
	require.Equal(t, 200, via.StatusCode, string(viaBody))
	assert.Equal(t, "same-id-1", via.Header.Get("X-Request-Id"))
	assert.Contains(t, via.Header.Get("Server-Timing"), "queue;dur=")

	req, _ := http.NewRequest("POST", rep.url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("X-Request-Id", "same-id-1")
	req.Header.Set("Content-Type", "application/json")
	direct, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	directBody := readAll(t, direct)

	var a, b map[string]any
	require.NoError(t, json.Unmarshal(viaBody, &a))
	require.NoError(t, json.Unmarshal(directBody, &b))
	delete(a, "created")
	delete(b, "created")
	// vLLM's non-stream body carries null members (refusal, audio, …) that
	// the simulator omits; null and absent mean the same to clients.
	assert.Equal(t, dropNulls(b), dropNulls(a))
}

func dropNulls(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if e == nil {
				delete(x, k)
				continue
			}
			x[k] = dropNulls(e)
		}
	case []any:
		for i, e := range x {
			x[i] = dropNulls(e)
		}
	}
	return v
}

func TestUnauthorized(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	resp := n.post(t, "/v1/chat/completions", "wrong", chatBody)
	body := readAll(t, resp)
	assert.Equal(t, 401, resp.StatusCode)
	code, _ := errorCode(t, body)
	assert.Equal(t, "invalid_api_key", code)
	assert.NotContains(t, string(body), "wrong")
	assert.Equal(t, int64(0), rep.Stats().Received)
}
