package node

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

const tinyCompletion = `{"model":"sim-model","prompt":[1,2,3,4],"max_tokens":3,"ignore_eos":true}`

// TestBug13_1_TwoInstancesOnRedis: clamp and unclamp on A (A's policy
// version moves past B's), then B serves the tenant with 200; a budget set
// through A's admin API is enforced by B, and a clamp on A applies on B.
func TestBug13_1_TwoInstancesOnRedis(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	a := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 8\n", redisTop(rds)))
	b := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 8\n", redisTop(rds)))

	code, _, raw := a.adminDo(t, "POST", "/admin/tenants/acme/clamp", `{"concurrency":1,"reason":"test","expires_in":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	code, _, raw = a.adminDo(t, "DELETE", "/admin/tenants/acme/clamp", "")
	require.Equal(t, 200, code, string(raw))
	for _, n := range []*node{a, b} {
		r := n.call(t, "/v1/completions", keyAcme, tinyCompletion)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
	}

	code, _, raw = a.adminDo(t, "PUT", "/admin/budgets", `{"tenant":"acme","dimension":"requests","limit":3,"window":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	eventually(t, "B lists A's budget", func() bool {
		_, _, raw := b.adminDo(t, "GET", "/admin/budgets?tenant=acme", "")
		return strings.Contains(string(raw), `"source":"admin"`)
	})
	// Two requests already ran; the budget allows one more, through either.
	r := b.call(t, "/v1/completions", keyAcme, tinyCompletion)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	r = b.call(t, "/v1/completions", keyAcme, tinyCompletion)
	assert.Equal(t, 429, r.StatusCode, "A's budget is enforced by B: %s", r.Body)
	ecode, det := errorCodeOf(t, r.Body)
	assert.Equal(t, "tenant_budget_exceeded", ecode)
	assert.Equal(t, "requests", det["dimension"])
	assert.Equal(t, int64(3), rep.Stats().Received)
}

// TestBug13_1_RestartWithJournalAfterAdminChange: after a clamp and an
// unclamp, a restart on the same journal serves the tenant with 200 and
// keeps its committed usage and the admin state.
func TestBug13_1_RestartWithJournalAfterAdminChange(t *testing.T) {
	dir := t.TempDir()
	rep := startSim(t, sim.DefaultConfig())
	top := fmt.Sprintf("ledger: {journal: %q}\nadmin: {state_file: %q}\n", dir+"/journal", dir+"/admin.json")
	cfg := func() *config.File {
		return nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: requests, limit: 100, window: 24h}]\n", top)
	}
	n := startNode(t, cfg())
	code, _, raw := n.adminDo(t, "POST", "/admin/tenants/acme/clamp", `{"concurrency":1,"reason":"test","expires_in":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	code, _, raw = n.adminDo(t, "DELETE", "/admin/tenants/acme/clamp", "")
	require.Equal(t, 200, code, string(raw))
	code, _, raw = n.adminDo(t, "PUT", "/admin/budgets", `{"tenant":"acme","dimension":"tokens","limit":100000,"window":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	r := n.call(t, "/v1/completions", keyAcme, tinyCompletion)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	require.NoError(t, n.stop())

	n2 := startNode(t, cfg())
	r = n2.call(t, "/v1/completions", keyAcme, tinyCompletion)
	require.Equal(t, 200, r.StatusCode, "served after the restart: %s", r.Body)
	eventually(t, "committed usage of both runs", func() bool {
		return n2.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) == 2
	})
	_, _, raw = n2.adminDo(t, "GET", "/admin/budgets?tenant=acme", "")
	assert.Contains(t, string(raw), "acme:tokens:1h0m0s", "the admin budget survived the restart")
}
