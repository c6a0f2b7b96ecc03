package node

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestBudgetBurstTwoInstancesSharedRedis: two Sluice instances share one
// Redis ledger; 200 concurrent requests of a known size against a budget of
// exactly 142 of them: 142 run, 58 are refused, the replica sees 142.
func TestBudgetBurstTwoInstancesSharedRedis(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	// 10 prompt token ids + 5 output tokens (ignore_eos: actual == held).
	const perRequest = 15
	extra := fmt.Sprintf("    concurrency: 64\n    budgets: [{dimension: tokens, limit: %d, window: 1h}]\n", 142*perRequest)
	// The burst measures exact admission, not store latency: a store timeout
	// well above a loaded 2-core machine's scheduling delays.
	top := strings.Replace(redisTop(rds), "store_timeout: 1s", "store_timeout: 5s", 1)
	a := startNode(t, nodeConfig(t, []*simReplica{rep}, extra, top))
	b := startNode(t, nodeConfig(t, []*simReplica{rep}, extra, top))
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":5,"ignore_eos":true}`

	var ok, denied, other atomic.Int64
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		n := a
		if i%2 == 1 {
			n = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp := n.call(t, "/v1/completions", keyAcme, body)
			rb := resp.Body
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				code, det := errorCodeOf(t, rb)
				if code == "tenant_budget_exceeded" && det["dimension"] == "tokens" && resp.Header.Get("Retry-After") != "" {
					denied.Add(1)
					return
				}
				fallthrough
			default:
				other.Add(1)
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(rb))))
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, int64(142), ok.Load())
	assert.Equal(t, int64(58), denied.Load())
	assert.Equal(t, int64(0), other.Load(), "unexpected responses: %v", bad)
	assert.Equal(t, int64(142), rep.Stats().Received, "the replica must see exactly the admitted requests")
	eventually(t, "holds released on both instances", func() bool {
		return a.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0 &&
			a.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 142*perRequest
	})
}

// TestLedgerDown503: with Redis stopped, nothing is dispatched and the
// client gets 503 ledger_unavailable.
func TestLedgerDown503(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: tokens, limit: 100000, window: 1h}]\n", redisTop(rds)))
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)

	rds.stop()
	for range 3 {
		resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
		body := readAll(t, resp)
		require.Equal(t, 503, resp.StatusCode, string(body))
		code, _ := errorCode(t, body)
		assert.Equal(t, "ledger_unavailable", code)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	}
	assert.Equal(t, int64(1), rep.Stats().Received, "nothing may reach the replica while the ledger is down")
	assert.Positive(t, n.metric(t, "sluice_ledger_errors_total", map[string]string{"kind": "unavailable"}))
}

// TestIdempotentReplayOnAnotherInstance: a keyed non-streamed request
// completed on instance A is retried on instance B (a load balancer's
// choice): B answers A's original response from the fleet's response
// store, marked Idempotent-Replayed, without running it again or charging
// twice; a key never seen still runs on B.
func TestIdempotentReplayOnAnotherInstance(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	extra := "    budgets: [{dimension: tokens, limit: 1000000, window: 1h}]\n"
	a := startNode(t, nodeConfig(t, []*simReplica{rep}, extra, redisTop(rds)))
	b := startNode(t, nodeConfig(t, []*simReplica{rep}, extra, redisTop(rds)))
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":5,"ignore_eos":true}`

	first := a.call(t, "/v1/completions", keyAcme, body, "Idempotency-Key", "retry-me")
	require.Equal(t, 200, first.StatusCode, string(first.Body))
	again := b.call(t, "/v1/completions", keyAcme, body, "Idempotency-Key", "retry-me")
	require.Equal(t, 200, again.StatusCode, string(again.Body))
	assert.Equal(t, string(first.Body), string(again.Body), "the original response, not a new one")
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), rep.Stats().Received, "ran once")

	other := b.call(t, "/v1/completions", keyAcme, body, "Idempotency-Key", "new-key")
	require.Equal(t, 200, other.StatusCode, string(other.Body))
	assert.Empty(t, other.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(2), rep.Stats().Received)
	eventually(t, "two charges of 15 tokens", func() bool {
		return b.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 2*15 &&
			b.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0
	})
}
