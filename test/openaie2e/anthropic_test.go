package openaie2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestOfficialAnthropicNodeClient drives /v1/messages with the official
// Anthropic TypeScript SDK (test/openai-node/anthropic): create, stream
// with usage, count_tokens, cancel → upstream abort, a budget refusal
// raised as the SDK's RateLimitError and sent once.
func TestOfficialAnthropicNodeClient(t *testing.T) {
	nodeBin := requireNode(t)
	ensureNodeModules(t)

	scfg := sim.DefaultConfig()
	scfg.DecodeStep = 10 * time.Millisecond // slow enough to cancel mid-stream
	scfg.OutputLenMin, scfg.OutputLenMax = 150, 200
	rep, repURL := startSim(t, scfg)
	n := startNode(t, nodeConfig(t, repURL))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "--test", "--test-reporter=spec", "--test-concurrency=1", "messages.test.js")
	cmd.Dir = filepath.Join(jsDir, "anthropic")
	cmd.Env = append(os.Environ(),
		"SLUICE_ANTHROPIC_URL="+n.api,
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
	require.NoError(t, runErr, "node --test in test/openai-node/anthropic failed (its output is above)")

	eventually(t, "the simulator aborts the cancelled stream", func() bool {
		s := rep.Stats()
		return s.Aborted == 1 && s.Running == 0
	})
	// acme's create, stream and cancelled stream, limited's first call:
	// the refused call and the unknown key never reach the replica.
	s := rep.Stats()
	assert.Equal(t, int64(4), s.Received, "messages at the simulator")
	assert.Equal(t, int64(3), s.Completed)
	eventually(t, "holds released, usage committed", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}) > 0
	})
	assert.InDelta(t, 1.0, n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}), 1e-9)
	assert.InDelta(t, 2.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "limited"}), 1e-9,
		"the refused call was sent once")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_rejections_total", map[string]string{"tenant": "limited", "reason": "tenant_budget_exceeded"}), 1e-9)
}
