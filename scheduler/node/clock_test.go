package node

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestNodeRunsOnItsClock: Options.Clock is the time of the embedded
// ledger's windows and of the scheduler. On a clock set behind the
// runtime's, a full 1h budget answers Retry-After up to that clock's next
// hour, and a request deadline still bounds the request by what is left
// of it (a deadline taken as an instant of the runtime's clock would have
// passed before the request started).
func TestNodeRunsOnItsClock(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	now := time.Now()
	toHour := 10 * time.Minute
	if real := now.Truncate(time.Hour).Add(time.Hour).Sub(now); real > 5*time.Minute && real < 15*time.Minute {
		toHour = 35 * time.Minute // far from what the runtime's clock would answer
	}
	offset := now.Truncate(time.Hour).Add(-toHour).Sub(now) // toHour before the last hour
	clock := func() time.Time { return time.Now().Add(offset) }
	cfg := nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: requests, limit: 1, window: 1h}]\n", "")
	n := startNodeOpts(t, cfg, Options{Clock: clock})

	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody, "X-Request-Timeout", "30")
	body := readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode, "the deadline is 30 s from now on any clock: %s", body)

	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	body = readAll(t, resp)
	require.Equal(t, 429, resp.StatusCode, string(body))
	ms, err := strconv.ParseInt(resp.Header.Get("retry-after-ms"), 10, 64)
	require.NoError(t, err)
	left := clock().Truncate(time.Hour).Add(time.Hour).Sub(clock())
	assert.InDelta(t, left.Milliseconds(), ms, float64(30*time.Second/time.Millisecond),
		"the window ends on the node's clock's hour (%v away), not the runtime's", left)
}
