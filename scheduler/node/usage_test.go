package node

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// Usage is counted per tenant, key and model whether or not a budget
// exists: beta has none, and its usage still adds up to what the replica
// ran.
func TestUsageCountedWithoutABudget(t *testing.T) {
	t.Parallel()
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets, ""))
	for range 3 {
		r := n.call(t, "/v1/chat/completions", keyBeta, `{"model":"sim-model","max_tokens":5,"messages":[{"role":"user","content":"count me"}]}`)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
	}
	labels := func(dim string) map[string]string {
		return map[string]string{"tenant": "beta", "key": "_unnamed", "model": "sim-model", "dimension": dim}
	}
	eventually(t, "usage counted", func() bool { return n.metric(t, "sluice_usage_total", labels("requests")) == 3 })
	st := rep.Stats()
	assert.InDelta(t, float64(st.PromptTokens), n.metric(t, "sluice_usage_total", labels("input_tokens")), 1e-9)
	assert.InDelta(t, float64(st.GenerationTokens), n.metric(t, "sluice_usage_total", labels("output_tokens")), 1e-9)
	r := n.call(t, "/v1/embeddings", keyBeta, `{"model":"sim-model","input":"and me"}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	eventually(t, "embeddings counted", func() bool { return n.metric(t, "sluice_usage_total", labels("requests")) == 4 })
	assert.InDelta(t, float64(rep.Stats().PromptTokens), n.metric(t, "sluice_usage_total", labels("input_tokens")), 1e-9)
	assert.Zero(t, n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "beta", "dimension": "tokens"}),
		"no budget, so the ledger's window gauge shows nothing: the usage counters are the chargeback view")
}
