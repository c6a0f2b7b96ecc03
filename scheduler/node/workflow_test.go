package node

import (
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

func createWorkflow(t *testing.T, n *node, body string) string {
	t.Helper()
	resp := n.post(t, "/v1/workflows", keyAcme, body)
	b := readAll(t, resp)
	require.Equal(t, 201, resp.StatusCode, string(b))
	var out struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(b, &out))
	require.True(t, strings.HasPrefix(out.ID, "wf_"))
	return out.ID
}

func TestWorkflowMaxCalls(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    workflow_defaults: {max_calls: 3, max_output_tokens: 100000}\n", ""))
	for i := range 3 {
		resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", "agent-run-1")
		b := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, "call %d: %s", i, b)
	}
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", "agent-run-1")
	b := readAll(t, resp)
	require.Equal(t, 429, resp.StatusCode, string(b))
	code, det := errorCode(t, b)
	assert.Equal(t, "workflow_budget_exceeded", code)
	assert.Equal(t, "workflow", det["scope"])
	assert.Equal(t, "requests", det["dimension"])
	assert.Equal(t, "false", resp.Header.Get("x-should-retry"))
	// Another workflow of the same tenant is unaffected.
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", "agent-run-2")
	readAll(t, resp)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, int64(4), rep.Stats().Received)
}

func TestWorkflowOutputCapLowered(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	id := createWorkflow(t, n, `{"max_output_tokens":100}`)
	body := `{"model":"sim-model","prompt":"x","max_tokens":80,"ignore_eos":true}`
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	for i, want := range []int{80, 20} {
		resp := n.post(t, "/v1/completions", keyAcme, body, "X-Workflow-Id", id)
		b := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, string(b))
		require.NoError(t, json.Unmarshal(b, &out))
		assert.Equal(t, want, out.Usage.CompletionTokens, "call %d is sent upstream with the cap the envelope still allows", i)
	}
	resp := n.post(t, "/v1/completions", keyAcme, body, "X-Workflow-Id", id)
	b := readAll(t, resp)
	assert.Equal(t, 429, resp.StatusCode, string(b))

	get, err := n.get(t, "/v1/workflows/"+id, keyAcme)
	require.NoError(t, err)
	assert.Contains(t, get, `"output_tokens":100`)
}

func TestWorkflowDurationShortensThenRefuses(t *testing.T) {
	rep := startSim(t, slowSim())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	id := createWorkflow(t, n, `{"max_output_tokens":100000,"max_duration":"1700ms"}`)
	start := time.Now()
	resp := n.post(t, "/v1/completions", keyAcme, longStream, "X-Workflow-Id", id, "X-Request-Timeout", "60")
	body := readAll(t, resp)
	elapsed := time.Since(start)
	require.Equal(t, 200, resp.StatusCode)
	assert.Contains(t, string(body), `"code":"deadline_exceeded"`, "the upstream call was cut at the envelope's end")
	assert.Less(t, elapsed, 5*time.Second, "the 60s client timeout was shortened to the envelope's remaining time")
	resp = n.post(t, "/v1/completions", keyAcme, longStream, "X-Workflow-Id", id)
	b := readAll(t, resp)
	require.Equal(t, 429, resp.StatusCode, string(b))
	_, det := errorCode(t, b)
	assert.Equal(t, "duration", det["dimension"])
}

func TestWorkflowRetries(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	id := createWorkflow(t, n, `{"max_output_tokens":100000,"max_retries":1}`)
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", id, "X-Stainless-Retry-Count", "1")
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", id, "X-Stainless-Retry-Count", "2")
	b := readAll(t, resp)
	require.Equal(t, 429, resp.StatusCode)
	_, det := errorCode(t, b)
	assert.Equal(t, "retries", det["dimension"])
	// A first attempt is not a retry.
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", id)
	readAll(t, resp)
	assert.Equal(t, 200, resp.StatusCode)
}

func TestWorkflowConcurrentCallsNeverExceedEnvelope(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 32\n", ""))
	id := createWorkflow(t, n, `{"max_calls":5,"max_output_tokens":100000}`)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp := n.call(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", id)
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				if code, _ := errorCodeOf(t, resp.Body); code == "workflow_budget_exceeded" {
					refused.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, int64(5), ok.Load())
	assert.Equal(t, int64(15), refused.Load())
	assert.Equal(t, int64(5), rep.Stats().Received)
}

func TestWorkflowCreateValidation(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	for _, tc := range []struct{ body, param string }{
		{`{"max_calls":-1,"max_output_tokens":5}`, "max_calls"},
		{`{"max_output_tokens":5,"max_duration":"-3s"}`, "max_duration"},
		{`{"max_calls":3}`, "max_output_tokens"},
	} {
		resp := n.post(t, "/v1/workflows", keyAcme, tc.body)
		b := readAll(t, resp)
		assert.Equal(t, 400, resp.StatusCode, string(b))
		assert.Contains(t, string(b), `"param":"`+tc.param+`"`)
	}
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Workflow-Id", "never-created")
	b := readAll(t, resp)
	assert.Equal(t, 400, resp.StatusCode, "no defaults: an unknown workflow is refused: %s", b)
}
