package node

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestClientDisconnectDuringPrefill: the client leaves while the replica is
// still prefilling a long prompt (before any event, so before the response
// headers: a stream's go out with its first event); the replica aborts the
// request and the ledger charges the prompt (prefill ran) plus at most the
// allowance.
func TestClientDisconnectDuringPrefill(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.PrefillTPS = 500 // a 1500-token prompt prefills for 3 s
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets+"    max_input_tokens: 4000\n", ""))
	ids := strings.TrimSuffix(strings.Repeat("7,", 1500), ",")
	body := fmt.Sprintf(`{"model":"sim-model","prompt":[%s],"max_tokens":50,"ignore_eos":true,"stream":true}`, ids)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", n.api+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	eventually(t, "prefill running", func() bool { return rep.Stats().Running == 1 })
	cancel()
	require.Error(t, <-done, "no headers before the first event")

	eventually(t, "aborted", func() bool { return rep.Stats().Aborted == 1 && rep.Stats().Running == 0 })
	eventually(t, "settled", func() bool {
		return n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}) == 1 &&
			n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0
	})
	in := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "input_tokens"})
	out := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"})
	assert.InDelta(t, 1500.0, in, 1e-9, "the prompt is charged: prefill ran")
	gen := float64(rep.Stats().GenerationTokens)
	assert.Zero(t, gen, "aborted during prefill: nothing generated")
	assert.InDelta(t, gen, out, 1, "output charged = generated ± the one-token allowance")
}

// TestUpstreamError502: a replica failing a request is a 502 upstream_error
// and the request settles without leaking its hold.
func TestUpstreamError502(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.Faults.ErrorRate = 1
	sc.Faults.ErrorStatus = 500
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets, ""))
	for _, stream := range []bool{false, true} {
		resp := n.post(t, "/v1/completions", keyAcme, fmt.Sprintf(`{"model":"sim-model","prompt":"x","max_tokens":5,"stream":%v}`, stream))
		body := readAll(t, resp)
		assert.Equal(t, 502, resp.StatusCode, string(body))
		code, _ := errorCode(t, body)
		assert.Equal(t, "upstream_error", code)
	}
	eventually(t, "holds released", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_inflight_requests", map[string]string{"tenant": "acme"}) == 0
	})
}

// TestNoHealthyReplica503: once the only replica is down, requests get 503
// no_healthy_replica and /readyz fails.
func TestNoHealthyReplica503(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.Faults.DeadAfter = 400 * time.Millisecond // /health 503 from then on
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	eventually(t, "replica down", func() bool {
		r, err := http.Get(n.api + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 503
	})
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	body := readAll(t, resp)
	assert.Equal(t, 503, resp.StatusCode, string(body))
	code, _ := errorCode(t, body)
	assert.Equal(t, "no_healthy_replica", code)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
}
