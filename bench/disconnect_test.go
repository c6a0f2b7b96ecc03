package bench

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestDisconnectScenarioAbortsUpstream: planned mid-stream cancels are
// classified client_timeout/planned_cancel (never error), and the
// simulator, which aborts like vLLM, sees every one of them as an abort.
func TestDisconnectScenarioAbortsUpstream(t *testing.T) {
	t.Parallel()
	rep, err := sim.New(sim.Config{Model: "sim-model", DecodeStep: 5 * time.Millisecond})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { _ = rep.Serve(ctx, ln) })
	defer func() { cancel(); wg.Wait() }()

	wl := writeWorkload(t, `
seed: 9
defaults: {input: {dist: fixed, value: 8}, output: {dist: fixed, value: 64}}
tenants:
  - {name: survivor, rate: 100, num_prompts: 4}
  - {name: quitter, rate: 100, num_prompts: 6, cancel: {fraction: 1, after_chunks: {dist: fixed, value: 2}}}
`)
	res, err := Run(ctx, Options{Workload: wl, BaseURL: "http://" + ln.Addr().String(), Now: fixedNow})
	require.NoError(t, err)
	d := res.Doc
	assert.InDelta(t, 6.0, f(d, "tenants", "quitter", "outcomes", "client_timeout", "planned_cancel"), 0)
	assert.InDelta(t, 4.0, f(d, "tenants", "survivor", "completed"), 0)
	assert.InDelta(t, 0.0, f(d, "outcomes", "error", "-"), 0)
	assert.Empty(t, d.M("outcomes")["error"], "no errors")
	for _, r := range res.Raw.Records {
		if r.Tenant == 1 {
			assert.Equal(t, 2, r.Chunks, "cancelled after exactly 2 chunks")
		}
	}
	require.Eventually(t, func() bool { return rep.Stats().Aborted == 6 }, 5*time.Second, 5*time.Millisecond,
		"the simulator aborts every cancelled request")
	assert.Equal(t, int64(4), rep.Stats().Completed)
}
