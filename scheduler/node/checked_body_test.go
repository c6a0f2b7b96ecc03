package node

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/vllm/sim"
)

// A body Sluice cannot read whole never reaches the replica: a member
// nested past the scanner's depth could hide a second "input" that vLLM's
// json.loads would run, unsized, past a 2,000-token block budget.
func TestUnreadableBodiesNeverReachTheReplica(t *testing.T) {
	t.Parallel()
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    budgets:\n      - {dimension: tokens, limit: 2000, window: 1h}\n", ""))
	deep := strings.Repeat("[", 600) + "1" + strings.Repeat("]", 600)
	big := `"` + strings.Repeat("word ", 6000) + `"`
	for name, body := range map[string]string{
		"deep member hides a second input": `{"model":"sim-model","input":"hi","x":` + deep + `,"input":` + big + `}`,
		"duplicate input":                  `{"model":"sim-model","input":"hi","input":` + big + `}`,
		"input and messages":               `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"input":` + big + `}`,
	} {
		r := n.call(t, "/v1/embeddings", keyAcme, body)
		assert.Equal(t, 400, r.StatusCode, "%s: %s", name, r.Body)
		code, _ := errorCode(t, r.Body)
		assert.Equal(t, "invalid_request", code, name)
	}
	r := n.call(t, "/v1/responses", keyAcme, `{"model":"sim-model","input":"hi","background":true}`)
	assert.Equal(t, 400, r.StatusCode, "background responses: %s", r.Body)
	assert.Zero(t, rep.Stats().Received, "nothing reached the replica")
	assert.Zero(t, n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}))
}
