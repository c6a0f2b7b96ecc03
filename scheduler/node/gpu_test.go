package node

import (
	"encoding/json"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestGPUMsConservation: under a two-tenant load, the GPU-ms attributed to
// requests add up to the simulated GPU's busy time, and a tenant with twice
// the work gets twice the GPU-ms.
func TestGPUMsConservation(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.DecodeStep = 4 * time.Millisecond
	rep := startSim(t, sc)
	// Metered from the simulator's busy counter (telemetry vllm): with no
	// meter (off), attribution is wall-clock running time, which includes
	// scheduling and network latency and on a loaded host reads ~1 % high.
	cfg := nodeConfig(t, []*simReplica{rep}, "    concurrency: 8\n", "")
	cfg.GPU.Telemetry = "vllm"
	n := startNode(t, cfg)
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8],"max_tokens":100,"ignore_eos":true}`
	// acme sends four requests a round, beta two: 2:1 work. The rounds run
	// in lockstep (all six start together, the next round when all have
	// finished), so every request shares the batch with the same peers for
	// (almost) its whole life and the split does not depend on how the
	// host schedules six free-running workers: a straggler running alone
	// at the end would take up to 6× its share.
	for range 5 {
		var wg sync.WaitGroup
		for worker := range 6 {
			key := keyAcme
			if worker >= 4 {
				key = keyBeta
			}
			wg.Go(func() {
				if r := n.call(t, "/v1/completions", key, body); r.StatusCode != 200 {
					t.Errorf("status %d", r.StatusCode)
				}
			})
		}
		wg.Wait()
	}
	eventually(t, "replica idle", func() bool { return rep.Stats().Running == 0 })
	eventually(t, "meter caught up", func() bool {
		got := n.metric(t, "sluice_replica_gpu_busy_seconds_total", map[string]string{"replica": "r0"})
		return math.Abs(got-rep.Stats().BusyTime.Seconds()) < 1e-6
	})
	acme := n.metric(t, "sluice_tenant_gpu_ms_total", map[string]string{"tenant": "acme"})
	beta := n.metric(t, "sluice_tenant_gpu_ms_total", map[string]string{"tenant": "beta"})
	busyMs := float64(rep.Stats().BusyTime) / float64(time.Millisecond)
	require.Positive(t, busyMs)
	t.Logf("attributed acme %.1f + beta %.1f = %.1f GPU-ms; simulator busy %.1f ms", acme, beta, acme+beta, busyMs)
	assert.InEpsilon(t, busyMs, acme+beta, 0.01, "Σ per-request GPU-ms vs busy time")
	assert.InEpsilon(t, 2.0, acme/beta, 0.05, "acme/beta = %.3f", acme/beta)
}

// TestGPUMsBudgetEnforced: a gpu_ms budget refuses with 429 naming gpu_ms.
func TestGPUMsBudgetEnforced(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: gpu_ms, limit: 1000, window: 1h}]\n", ""))
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8],"max_tokens":60,"ignore_eos":true}`
	for i := 0; ; i++ {
		require.Less(t, i, 50, "the gpu_ms budget never refused")
		resp := n.post(t, "/v1/completions", keyAcme, body)
		b := readAll(t, resp)
		if resp.StatusCode == 200 {
			continue
		}
		require.Equal(t, 429, resp.StatusCode, string(b))
		code, det := errorCode(t, b)
		assert.Equal(t, "tenant_budget_exceeded", code)
		assert.Equal(t, "gpu_ms", det["dimension"])
		assert.EqualValues(t, 1000, det["limit"])
		assert.Positive(t, det["committed"])
		return
	}
}

// replicaRows reads /admin/replicas.
func (n *node) replicaRows(t *testing.T) map[string]map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", n.adminURL+"/admin/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+keyAdmin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(readAll(t, resp), &rows))
	out := map[string]map[string]any{}
	for _, r := range rows {
		out[r["name"].(string)] = r
	}
	return out
}

func (n *node) admin(t *testing.T, method, path string) int {
	t.Helper()
	req, _ := http.NewRequest(method, n.adminURL+path, nil)
	req.Header.Set("Authorization", "Bearer "+keyAdmin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	readAll(t, resp)
	return resp.StatusCode
}

// TestHalvedKVGetsHalfTheLoad: a replica with half the KV capacity carries
// half the in-flight tokens; a drained replica gets nothing new while its
// running request finishes.
func TestHalvedKVGetsHalfTheLoad(t *testing.T) {
	big := slowSim()
	small := slowSim()
	small.KVTokens = big.KVTokens / 2
	r0, r1 := startSim(t, big), startSim(t, small)
	cfg := nodeConfig(t, []*simReplica{r0, r1}, "    concurrency: 64\n", "")
	cfg.GPU.MaxOvercommit = 1
	n := startNode(t, cfg)
	eventually(t, "both sized", func() bool {
		rows := n.replicaRows(t)
		return rows["r0"]["capacity_tokens"].(float64) == 65536 && rows["r1"]["capacity_tokens"].(float64) == 32768
	})
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8],"max_tokens":1000,"ignore_eos":true,"stream":true}`
	for range 12 {
		resp := n.post(t, "/v1/completions", keyAcme, body)
		defer resp.Body.Close() // the streams stay open to the end of the test
		require.Equal(t, 200, resp.StatusCode)
	}
	rows := n.replicaRows(t)
	assert.InDelta(t, 8*1008.0, rows["r0"]["inflight_tokens"], 1e-9, "r0")
	assert.InDelta(t, 4*1008.0, rows["r1"]["inflight_tokens"], 1e-9, "r1: half the capacity, half the load")

	// Drain r1: its four requests keep running, new work goes to r0 only.
	require.Equal(t, 200, n.admin(t, "POST", "/admin/replicas/r1/drain?reason=test"))
	before := r1.Stats().Received
	for range 2 {
		resp := n.post(t, "/v1/completions", keyAcme, body)
		defer resp.Body.Close() // the streams stay open to the end of the test
		require.Equal(t, 200, resp.StatusCode)
	}
	assert.Equal(t, before, r1.Stats().Received, "a draining replica gets nothing new")
	eventually(t, "r1 keeps running what it has", func() bool { return r1.Stats().Running == 4 })
}

// TestGPUJoulesBudgetEnforced: with the simulator's energy counter metering
// the replica, requests settle GPU energy into a gpu_joules budget
// (millijoules) and the budget refuses with 429 naming gpu_joules once the
// next request's energy hold no longer fits.
func TestGPUJoulesBudgetEnforced(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	cfg := nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: gpu_joules, limit: 2000000, window: 1h}]\n", "")
	cfg.GPU.Telemetry = "vllm"
	n := startNode(t, cfg)
	body := `{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8],"max_tokens":60,"ignore_eos":true}`
	for i := 0; ; i++ {
		require.Less(t, i, 100, "the gpu_joules budget never refused")
		resp := n.post(t, "/v1/completions", keyAcme, body)
		b := readAll(t, resp)
		if resp.StatusCode == 200 {
			continue
		}
		require.Equal(t, 429, resp.StatusCode, string(b))
		code, det := errorCode(t, b)
		assert.Equal(t, "tenant_budget_exceeded", code)
		assert.Equal(t, "gpu_joules", det["dimension"])
		assert.EqualValues(t, 2000000, det["limit"])
		assert.Positive(t, det["committed"], "settled requests charged their energy")
		return
	}
}
