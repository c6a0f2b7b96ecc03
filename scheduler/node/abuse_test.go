package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/vllm/sim"
)

// TestAutomaticClamp: a tenant spending far above its floor rate is clamped
// by the abuse detector within the window; the clamp is audited, counted
// and ends on time.
func TestAutomaticClamp(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	path := filepath.Join(t.TempDir(), "audit.log")
	abuseCfg := "    abuse:\n      window: 2s\n      baseline: 20s\n      min_rate: {tokens_per_second: 20}\n" +
		"      spend_rate_factor: 2\n      clamp: {concurrency: 1, max_output_tokens: 4, duration: 2s}\n"
	cfg := nodeConfig(t, []*simReplica{rep}, abuseCfg, "")
	cfg.Audit.Path = path
	n := startNode(t, cfg)

	start := time.Now()
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":40,"ignore_eos":true}`
	clamped := false
	for i := 0; i < 100 && !clamped; i++ {
		n.call(t, "/v1/completions", keyAcme, body)
		_, _, raw := n.adminDo(t, "GET", "/admin/tenants", "")
		clamped = strings.Contains(string(raw), `"source":"auto"`)
	}
	require.True(t, clamped, "the flood was never clamped")
	assert.Less(t, time.Since(start), 2*time.Second, "clamped within the detector window")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_abuse_clamps_total", map[string]string{"tenant": "acme", "detector": "spend_rate"}), 1e-9)
	eventually(t, "auto clamp expired", func() bool {
		_, _, raw := n.adminDo(t, "GET", "/admin/tenants", "")
		return !strings.Contains(string(raw), `"source":"auto"`)
	})
	require.NoError(t, n.stop())
	rep2, err := audit.Verify(path)
	require.NoError(t, err, "the audit trail with the clamp verifies")
	assert.Positive(t, rep2.Lines)
	trail, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(trail), `"kind":"clamp"`)
	assert.Contains(t, string(trail), `"source":"auto"`)
	assert.Contains(t, string(trail), "spend_rate")
}
