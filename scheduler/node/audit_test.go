package node

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/vllm/sim"
)

// TestAuditTrail: admissions, denials, settlements and admin changes land
// in one hash chain that verifies, and no raw key is written.
func TestAuditTrail(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	path := filepath.Join(t.TempDir(), "audit.log")
	cfg := nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: requests, limit: 3, window: 1h}]\n", "")
	cfg.Audit.Path = path
	n := startNode(t, cfg)
	for range 4 { // 3 admitted and settled, 1 denied
		n.call(t, "/v1/chat/completions", keyAcme, chatBody)
	}
	n.call(t, "/v1/chat/completions", "sk-not-a-key", chatBody)
	code, _, raw := n.adminDo(t, "POST", "/admin/tenants/beta/clamp", `{"concurrency":1,"reason":"audit test","expires_in":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	require.NoError(t, n.stop())

	rep2, err := audit.Verify(path)
	require.NoError(t, err)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	kinds := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		assert.NotContains(t, line, keyAcme)
		assert.NotContains(t, line, "sk-not-a-key")
		var rec struct {
			Kind string `json:"kind"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		kinds[rec.Kind]++
	}
	assert.Equal(t, rep2.Lines, kinds["admit"]+kinds["deny"]+kinds["settle"]+kinds["clamp"]+kinds["drain"]+kinds["release"]+kinds["unclamp"])
	assert.Equal(t, 3, kinds["admit"])
	assert.Equal(t, 3, kinds["settle"])
	assert.Equal(t, 2, kinds["deny"], "one budget denial, one bad key")
	assert.Equal(t, 1, kinds["clamp"])
}
