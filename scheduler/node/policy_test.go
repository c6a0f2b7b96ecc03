package node

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// TestGlobalBudgetTwoInstances: a fleet-wide budget admits exactly
// floor(limit/cost) requests from many tenants across two instances sharing
// Redis, with no false denials while tenant budgets are ample.
func TestGlobalBudgetTwoInstances(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	const perRequest, admitted = 15, 37 // 10 prompt ids + 5 output tokens
	top := redisTop(rds) + fmt.Sprintf("global: {budgets: [{dimension: tokens, limit: %d, window: 1h}]}\n", admitted*perRequest)
	mk := func() *config.File {
		cfg := nodeConfig(t, []*simReplica{rep}, "    concurrency: 64\n", top)
		for i := range 4 { // more tenants with ample budgets of their own
			cfg.Tenants = append(cfg.Tenants, config.Tenant{Name: fmt.Sprintf("t%d", i), APIKeys: config.Keys(config.HashKey(fmt.Sprintf("key-t%d", i))),
				Weight: 1, Concurrency: 64, MaxInputTokens: 1000, MaxOutputTokens: 100,
				Queue:   config.TenantQueue{MaxDepth: 256, MaxBytes: 1 << 20, MaxWait: 10e9, Order: "fifo"},
				Budgets: []config.Budget{{Dimension: "tokens", Limit: 1_000_000, Window: 3600e9, Mode: "block", WarnRatio: 0.8}}})
		}
		require.NoError(t, cfg.Validate())
		return cfg
	}
	a, b := startNode(t, mk()), startNode(t, mk())
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":5,"ignore_eos":true}`
	var ok, global, other atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 100 {
		n := a
		if i%2 == 1 {
			n = b
		}
		key := fmt.Sprintf("key-t%d", i%4)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp := n.call(t, "/v1/completions", key, body)
			rb := resp.Body
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				code, det := errorCodeOf(t, rb)
				if code == "tenant_budget_exceeded" && det["scope"] == "global" && det["dimension"] == "tokens" {
					global.Add(1)
					return
				}
				other.Add(1)
			default:
				other.Add(1)
				t.Logf("%d %s", resp.StatusCode, strings.TrimSpace(string(rb)))
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, int64(admitted), ok.Load(), "exactly floor(limit/cost) admitted fleet-wide")
	assert.Equal(t, int64(100-admitted), global.Load(), "every other request is a global denial")
	assert.Zero(t, other.Load())
	assert.Equal(t, int64(admitted), rep.Stats().Received)
	eventually(t, "global usage visible", func() bool {
		return a.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "_global", "dimension": "tokens"}) == admitted*perRequest
	})
	code, _, raw := a.adminDo(t, "GET", "/admin/budgets?tenant=_global", "")
	require.Equal(t, 200, code)
	assert.Contains(t, string(raw), `"id":"_global:tokens:1h0m0s"`)
}

// TestOutageAllowance: with the ledger unreachable, a tenant with an
// allowance of 5 requests gets exactly 5 and then 503; a tenant without
// one gets 503 at once; once the ledger answers, those 5 requests are in
// its committed usage exactly once.
func TestOutageAllowance(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	top := strings.Replace(redisTop(rds), "store_timeout: 1s", "store_timeout: 300ms", 1)
	cfg := nodeConfig(t, []*simReplica{rep},
		"    outage_allowance: {requests: 5}\n    budgets: [{dimension: requests, limit: 1000, window: 1h}]\n", top)
	n := startNode(t, cfg)
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)

	// The store stops answering (process stopped: no data is lost).
	require.NoError(t, rds.cmd.Process.Signal(syscall.SIGSTOP))
	resumed := false
	defer func() {
		if !resumed {
			_ = rds.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	resp = n.post(t, "/v1/chat/completions", keyBeta, chatBody)
	body := readAll(t, resp)
	require.Equal(t, 503, resp.StatusCode, "no allowance: refused at once: %s", body)
	code, _ := errorCode(t, body)
	assert.Equal(t, "ledger_unavailable", code)
	for i := range 5 {
		resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
		body = readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, "outage request %d: %s", i, body)
	}
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	body = readAll(t, resp)
	require.Equal(t, 503, resp.StatusCode, "allowance spent: %s", body)
	assert.InDelta(t, 5.0, n.metric(t, "sluice_outage_admissions_total", map[string]string{"tenant": "acme"}), 1e-9)
	assert.Equal(t, int64(6), rep.Stats().Received)

	require.NoError(t, rds.cmd.Process.Signal(syscall.SIGCONT))
	resumed = true
	eventually(t, "outage usage charged once", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) == 6
	})
	// It stays at 6: nothing is charged twice.
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)
	eventually(t, "one more normal request", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) == 7
	})
}
