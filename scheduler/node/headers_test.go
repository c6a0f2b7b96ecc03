package node

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestBudgetWarningHeader: X-Budget-Warning appears once a block budget
// passes its warning ratio, and for a warn-mode budget past its limit, which
// still admits.
func TestBudgetWarningHeader(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep},
		"    budgets: [{dimension: requests, limit: 4, window: 1h, warn_ratio: 0.5}]\n", ""))
	var warned []bool
	for range 4 {
		resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
		readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode)
		warned = append(warned, resp.Header.Get("X-Budget-Warning") == "soft_threshold")
		assert.NotEmpty(t, resp.Header.Get("Server-Timing"))
	}
	// After the grant: 1/4, 2/4 (= 0.5: warn), 3/4, 4/4.
	assert.Equal(t, []bool{false, true, true, true}, warned)
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	assert.Equal(t, 429, resp.StatusCode, "the block budget still refuses at its limit")

	// A warn-mode spend budget past its limit admits and warns (1 µUSD per
	// token, limit 1 µUSD).
	w := startNode(t, nodeConfig(t, []*simReplica{rep},
		"    budgets: [{dimension: usd_micros, limit: 1, window: 24h, mode: warn}]\n",
		"prices: [{model: sim-model, input_per_mtok: 1000000, output_per_mtok: 1000000}]\n"))
	for range 2 {
		resp := w.post(t, "/v1/chat/completions", keyAcme, chatBody)
		readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, "warn mode never refuses")
		assert.Equal(t, "soft_threshold", resp.Header.Get("X-Budget-Warning"))
	}
}
