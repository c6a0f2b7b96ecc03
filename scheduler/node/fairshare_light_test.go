package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// lightRun is what one window of runLightFleet measured.
type lightRun struct {
	ttft    []time.Duration // the light tenant's, one per request answered
	sent    int             // light requests sent in the window
	lost    int             // light requests without a 200 and a first chunk
	served  float64         // heavy completions per second
	running float64         // the replica's mean running sequences
}

// runLightFleet starts n instances (mode "local" or "fleet"; n = 1 is the
// single instance, fair_share: local) on one Redis in front of one
// simulated replica of 8 sequences. Two heavy tenants keep clients*2
// requests each open in total, split over the instances; a light tenant
// sends a short streamed request every 200 ms to the first instance only.
// It measures the light tenant's TTFT and the heavy goodput over window.
func runLightFleet(t *testing.T, n int, mode string, clients int, window time.Duration) lightRun {
	t.Helper()
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 2*time.Millisecond
	rep := startSim(t, sc)
	heavyAt := make([]int, n)
	for i := range heavyAt {
		heavyAt[i] = i
	}
	tenants := []fairTenant{{name: "acme", weight: 1, at: heavyAt}, {name: "beta", weight: 1, at: heavyAt}, {name: "lite", weight: 1, at: []int{0}}}
	top := redisTop(startRedis(t))
	nodes := make([]*node, n)
	for i := range nodes {
		nodes[i] = startNode(t, fairConfig(t, rep, top, mode, tenants))
		defer func() { require.NoError(t, nodes[i].stop()) }()
	}
	heavy := `{"model":"sim-model","prompt":"heavy","max_tokens":24,"ignore_eos":true}`
	light := `{"model":"sim-model","prompt":"lite","max_tokens":4,"ignore_eos":true,"stream":true}`
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	perInstance := 2 * clients / n // the same total load whatever n
	for _, ft := range tenants[:2] {
		for _, i := range ft.at {
			for range perInstance {
				closedLoop(ctx, &wg, nodes[i].api, ft.key(), heavy, &served)
			}
		}
	}
	defer func() { cancel(); wg.Wait() }()
	if mode == "fleet" {
		for i, nd := range nodes {
			eventually(t, fmt.Sprintf("instance %d exchanges", i), func() bool {
				return nd.metric(t, "sluice_fair_share_fleet", nil) == 1
			})
		}
	}
	time.Sleep(time.Second) // the heavy backlog and the shares settle; a span, not synchronisation

	var mu sync.Mutex
	var run lightRun
	var lwg sync.WaitGroup
	lite := tenants[2].key()
	s0, t0 := served.Load(), time.Now()
	stop := sampleQueue(rep)
	tick := time.NewTicker(200 * time.Millisecond)
	for time.Since(t0) < window {
		<-tick.C // an open-loop arrival every 200 ms, not synchronisation
		run.sent++
		lwg.Go(func() {
			d, err := firstChunk(nodes[0].api, lite, light)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Logf("light request: %v", err)
				run.lost++
				return
			}
			run.ttft = append(run.ttft, d)
		})
	}
	tick.Stop()
	lwg.Wait()
	run.running = stop().meanRunning
	run.served = float64(served.Load()-s0) / time.Since(t0).Seconds()
	if mode == "fleet" {
		for i, nd := range nodes {
			require.Equal(t, 1.0, nd.metric(t, "sluice_fair_share_fleet", nil), "instance %d fell back to local fair share", i)
		}
	}
	return run
}

// firstChunk sends one streamed completion and returns the time to its
// first data chunk; the rest is read and discarded. It may run on any
// goroutine.
func firstChunk(api, key, body string) (time.Duration, error) {
	req, _ := http.NewRequest("POST", api+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var buf []byte
	tmp := make([]byte, 1024)
	for !strings.Contains(string(buf), "data: ") {
		m, err := resp.Body.Read(tmp)
		buf = append(buf, tmp[:m]...)
		if err != nil && !strings.Contains(string(buf), "data: ") {
			return 0, fmt.Errorf("after %v: %v", time.Since(start), err)
		}
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, resp.Body)
	return d, nil
}

// pct is the q-quantile (nearest rank) of ds, sorted in place.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// TestFleetFairShareLightTenant: two heavy tenants backlogged through two
// instances on one Redis in front of one replica of 8 sequences, and a
// light tenant sending five short streamed requests a second to the first
// instance. Measured in interleaved rounds (the order rotates, so no mode
// always runs on the warmer or quieter machine): fair_share: fleet,
// fair_share: local, and one instance carrying the same total load. It
// reports the light tenant's p99 TTFT in each mode and the heavy goodput
// of fleet over local per round (completions per second and the replica's
// mean running sequences), with the median of the rounds.
// FLEET_LIGHT_ROUNDS sets the number of rounds (3).
//
// What it asserts holds on a loaded 2-core machine: every light request
// answered, the light tenant's p99 TTFT under fleet not far past the other
// modes' (a light tenant idle between its requests is lifted to the fleet
// floor, never past it, so it is first in line at the next free slot), and
// the replica's batch about as busy as with local fair share. The figures
// (the goals: p99 ≤ 1.5× single, goodput ≥ 0.98× local) are logged for
// BENCHMARKS.md, not asserted: on a shared CPU they swing between runs.
func TestFleetFairShareLightTenant(t *testing.T) {
	const clients = 10
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("FLEET_LIGHT_ROUNDS")); err == nil && v > 0 {
		rounds = v // BENCHMARKS.md's figures: more rounds
	}
	window := 4 * time.Second
	modes := []struct {
		name string
		n    int
		mode string
	}{{"fleet", 2, "fleet"}, {"local", 2, "local"}, {"single", 1, "local"}}
	ttft := map[string][]time.Duration{}
	var servedRatio, batchRatio []float64
	lost, sent := 0, map[string]int{}
	for r := range rounds {
		got := map[string]lightRun{}
		for k := range modes {
			m := modes[(k+r)%len(modes)]
			run := runLightFleet(t, m.n, m.mode, clients, window)
			got[m.name] = run
			ttft[m.name] = append(ttft[m.name], run.ttft...)
			lost += run.lost
			sent[m.name] += run.sent
			t.Logf("round %d %s: light p50 %v p99 %v (%d sent, %d lost); heavy %.1f req/s, batch %.2f",
				r, m.name, pct(run.ttft, 0.5), pct(run.ttft, 0.99), run.sent, run.lost, run.served, run.running)
		}
		servedRatio = append(servedRatio, got["fleet"].served/got["local"].served)
		batchRatio = append(batchRatio, got["fleet"].running/got["local"].running)
	}
	p90, p99 := map[string]time.Duration{}, map[string]time.Duration{}
	for name, ds := range ttft {
		p90[name], p99[name] = pct(ds, 0.9), pct(ds, 0.99)
	}
	t.Logf("light p90 TTFT: fleet %v, local %v, single %v", p90["fleet"], p90["local"], p90["single"])
	t.Logf("light p99 TTFT: fleet %v, local %v, single %v; fleet ÷ single %.2f, local ÷ single %.2f",
		p99["fleet"], p99["local"], p99["single"],
		p99["fleet"].Seconds()/p99["single"].Seconds(), p99["local"].Seconds()/p99["single"].Seconds())
	t.Logf("goodput fleet ÷ local per round: completions %.3f (median %.3f), batch %.3f (median %.3f)",
		servedRatio, median(servedRatio), batchRatio, median(batchRatio))
	assert.Zero(t, lost, "no light request lost")
	for _, name := range []string{"fleet", "local", "single"} {
		assert.Equal(t, sent[name], len(ttft[name]), "%s: every light request answered", name)
	}
	// A light request first in line waits for one heavy completion (24
	// decode steps, about 50 ms on an idle machine). Every mode's p99 here
	// is mostly a stall of the shared CPU, so the fleet arm is judged
	// against the other arms' rounds beside it, loosely: this catches a
	// light tenant starved behind the heavy tenants' counters, not a
	// subtle misorder (queue/fleet's TestFleetFloorKeepsBusyTenantsCounter
	// pins the lift). Lifting it past the floor measured fleet p99 442 ms
	// against local's 62 ms and single's 51 ms at load ~6 and failed this;
	// at load ~12 the stalls hid it (407 ms against 387 and 885 ms).
	worst := max(p99["local"], p99["single"])
	assert.Less(t, p99["fleet"], 3*worst+200*time.Millisecond, "fleet: the light tenant's p99 TTFT near the other modes'")
	assert.Greater(t, median(batchRatio), 0.7, "fleet keeps the replica's batch about as busy as local")
}
