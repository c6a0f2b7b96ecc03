package openaie2e

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestOpenAINodeEndpoints runs test/openai-node/endpoints/endpoints.test.js
// (embeddings.create, responses.create streamed and not, a cancelled
// responses stream) against Sluice and the simulator, then checks the
// server side: the cancelled stream was aborted upstream and every call
// was settled.
func TestOpenAINodeEndpoints(t *testing.T) {
	nodeBin := requireNode(t)
	ensureNodeModules(t)

	scfg := sim.DefaultConfig()
	scfg.DecodeStep = 10 * time.Millisecond // slow enough to cancel mid-stream
	scfg.OutputLenMax = 200
	// The cancelled stream (cap 150) must outlast its third delta: a short
	// answer ending as the client aborts left the SDK's read pending, which
	// node's test runner reports as "Promise resolution is still pending".
	scfg.OutputLenMin = 120
	rep, repURL := startSim(t, scfg)
	n := startNode(t, nodeConfig(t, repURL))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "--test", "--test-reporter=spec", "--test-concurrency=1", "endpoints/endpoints.test.js")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(),
		"SLUICE_BASE_URL="+n.api+"/v1",
		"SLUICE_API_KEY="+keyAcme,
		"SLUICE_LIMITED_KEY="+keyLimited,
		"SLUICE_METRICS_URL="+n.admin+"/metrics",
		"SLUICE_MODEL="+scfg.Model,
		"NO_COLOR=1",
	)
	out := &lineLogger{t: t, prefix: "node: "}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	out.flush()
	require.NoError(t, runErr, "node --test endpoints/endpoints.test.js failed (its output is above)")

	eventually(t, "the simulator aborts the cancelled responses stream", func() bool {
		s := rep.Stats()
		return s.Aborted == 1 && s.Running == 0
	})
	assert.InDelta(t, 1.0, n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}), 1e-9)
	eventually(t, "holds released and usage committed", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}) > 0
	})
	assert.InDelta(t, 3.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "ok"}), 1e-9, "embeddings and two responses")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "cancelled"}), 1e-9)
	assert.InDelta(t, 0.0, n.metric(t, "sluice_inflight_requests", nil), 1e-9)
}
