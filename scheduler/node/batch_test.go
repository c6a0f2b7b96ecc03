package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// ttftOf sends one streamed completion for key and returns the time to its
// first chunk (the rest is read and discarded).
func (n *node) ttftOf(t *testing.T, key, body string) time.Duration {
	t.Helper()
	req, _ := http.NewRequest("POST", n.api+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 1024)
	for strings.Count(string(buf), "data: ") < 1 {
		m, err := resp.Body.Read(tmp)
		buf = append(buf, tmp[:m]...)
		if err != nil && strings.Count(string(buf), "data: ") < 1 {
			t.Fatalf("after %v: %v; body %q", time.Since(start), err, buf)
		}
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, resp.Body)
	return d
}

// complete sends one completion for key and reads its answer to the end,
// or until ctx ends it (the client leaves).
func (n *node) complete(ctx context.Context, key, body string) {
	req, _ := http.NewRequestWithContext(ctx, "POST", n.api+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// openLoop calls send every interval until ctx ends, each in its own
// goroutine on wg, whatever became of the last: an open loop's arrivals.
// The ticker is the load's pace, not synchronisation.
func openLoop(ctx context.Context, wg *sync.WaitGroup, every time.Duration, send func()) {
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				wg.Go(send)
			}
		}
	})
}

// TestLearnedBatchProtectsLightTenant: max_num_seqs left out (the default
// 256) over a replica whose real batch is 8. A flooding tenant keeps 24
// requests open. Without the learned batch Sluice sends all 24, 16 wait in
// vLLM's FCFS queue, and a light tenant's request queues behind them
// there, where no fairness applies. Two scrapes with requests waiting
// while running stays at 8 teach Sluice the batch: from then on vLLM's
// waiting count stays at 0 and the light tenant's TTFT stays near its TTFT
// alone.
func TestLearnedBatchProtectsLightTenant(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 4*time.Millisecond
	rep := startSim(t, sc)
	cfg := nodeConfig(t, []*simReplica{rep}, "", "")
	require.Equal(t, 256, cfg.Upstream.Replicas[0].MaxNumSeqs, "max_num_seqs left at its default")
	n := startNode(t, cfg)

	light := `{"model":"sim-model","prompt":"hi","max_tokens":4,"ignore_eos":true,"stream":true}`
	flood := `{"model":"sim-model","prompt":"flood","max_tokens":100,"ignore_eos":true,"stream":true}`
	var alone []time.Duration
	for range 10 {
		alone = append(alone, n.ttftOf(t, keyBeta, light))
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 24 {
		closedLoop(ctx, &wg, n.api, keyAcme, flood, new(atomic.Int64))
	}
	defer func() { cancel(); wg.Wait() }()

	eventually(t, "batch learned", func() bool {
		return n.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
	})
	row := n.replicaRows(t)["r0"]
	assert.InDelta(t, 256.0, row["max_num_seqs"], 0)
	assert.InDelta(t, 8.0, row["learned_batch"], 0)
	assert.Positive(t, row["batch_limit"])
	assert.LessOrEqual(t, row["batch_limit"], 8.0, "the learned batch, or the running count under a stop")
	// What stood in vLLM's queue when the batch was learned drains first.
	eventually(t, "vLLM's queue drained", func() bool { return rep.Stats().Waiting == 0 })

	stop := sampleWaiting(rep)
	var flooded []time.Duration
	for range 30 {
		flooded = append(flooded, n.ttftOf(t, keyBeta, light))
	}
	most, mean := stop()
	t.Logf("flooded, in order: %v", flooded)
	later := slices.Clone(flooded[len(flooded)/2:])
	slices.Sort(alone)
	slices.Sort(flooded)
	slices.Sort(later)
	t.Logf("light TTFT alone p50 %v max %v; flooded p50 %v p90 %v max %v; vLLM waiting mean %.3f most %d",
		alone[len(alone)/2], alone[len(alone)-1], flooded[len(flooded)/2], flooded[len(flooded)*9/10], flooded[len(flooded)-1], mean, most)
	assert.Less(t, mean, 0.05, "nothing stands in vLLM's queue")
	// One flood request runs 100 decode steps (≥ 400 ms); a light request
	// queued behind 16 of them inside vLLM waits two of those (measured
	// without the learned batch: p50 1.16 s, p90 1.26 s, vLLM waiting 16.9
	// on average). A flood is classified heavy once the gate has seen its
	// rate for forecastWindow (scheduler/gate rateNow: a light tenant's burst
	// must not read as a flood), so light requests in the flood's first
	// seconds wait about one completion each (measured: 5 or 6 of the
	// first 12, 0.31–0.41 s; with the ramp, upstream.learn_ramp, less of
	// the flood waits in vLLM's queue, so this window starts sooner in
	// the flood's first seconds); none waits more, and from then on none
	// waits one.
	assert.Less(t, flooded[len(flooded)-1], 700*time.Millisecond, "no light request waits more than about one flood completion")
	assert.Less(t, later[len(later)*9/10], 250*time.Millisecond, "light tenant's TTFT protected once the flood is classified")
}

// TestLearnedBatchTwoInstances: two instances of a Redis fleet in front of
// one replica whose batch is 8, max_num_seqs left out, twelve flood
// streams each. Each learns the batch from the same scrapes, and the share
// exchange splits the learned batch, not 256 (fleet/share.go), so together they
// keep vLLM's queue near empty instead of 16 deep. Without the exchange
// (no Redis) the flood's synchronous completions let one instance's
// scrape catch the other's slots freed and about to be refilled, and it
// fills them too: vLLM's waiting count averaged 0–1.4 over 2 s in four
// runs, and 0.17–1.34 in three with max_num_seqs: 8 configured instead
// (fleet/sizing.go, "What remains inexact").
func TestLearnedBatchTwoInstances(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 4*time.Millisecond
	rep := startSim(t, sc)
	var nodes [2]*node
	top := redisTop(startRedis(t))
	for i := range nodes {
		nodes[i] = startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	}
	flood := `{"model":"sim-model","prompt":"flood","max_tokens":100,"ignore_eos":true,"stream":true}`
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, n := range nodes {
		for range 12 {
			closedLoop(ctx, &wg, n.api, keyAcme, flood, new(atomic.Int64))
		}
	}
	defer func() { cancel(); wg.Wait() }()
	for i, n := range nodes {
		eventually(t, fmt.Sprintf("instance %d learned the batch", i), func() bool {
			return n.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
		})
	}
	eventually(t, "the instances' shares split the learned batch", func() bool {
		var sum float64
		for _, n := range nodes {
			sum += n.metric(t, "sluice_replica_seq_share", map[string]string{"replica": "r0"})
		}
		return sum == 8
	})
	eventually(t, "vLLM's queue drained", func() bool { return rep.Stats().Waiting == 0 })
	stop := sampleQueue(rep)
	time.Sleep(2 * time.Second) // the span sampled, not synchronisation
	q := stop()
	t.Logf("vLLM over 2 s: waiting mean %.3f, most %d; running mean %.2f, most %d", q.meanWaiting, q.mostWaiting, q.meanRunning, q.mostRunning)
	assert.Less(t, q.meanWaiting, 0.5, "without the learned batch: 16 waiting")
	// Each completion frees a slot that the next dispatch refills a round
	// trip through an instance later, so the mean sits below 8: 7.83–7.89
	// on a quiet machine, 6.99 once at load 12. The shares' sum (above) is
	// the split itself; this is the batch it keeps busy.
	assert.Equal(t, int64(8), q.mostRunning, "the two instances' shares fill the batch")
	assert.Greater(t, q.meanRunning, 6.5, "the batch stays near full")
}

// TestLightTenantAtAnotherInstance: the flood of
// TestLearnedBatchProtectsLightTenant sent to one instance of a Redis
// fleet, the light tenant to the other. The share exchange leaves the
// light tenant's instance at least one sequence of the batch while it
// reports demand, so a light tenant sending one request after another is
// served as on the flood's own instance (measured: p90 7.3–8.5 ms). After
// a pause longer than a report's life (2 s) its instance still reports
// the room its gate keeps for the tenant's peak (gate.Gate.Kept), so
// the flood's instance leaves it free: 6–10 ms after 3 s pauses, against
// 0.27–0.64 s when only requests queued and in flight were reported. Its
// very first request, before its gate has seen it ask, waits for the
// exchange and a completion (0.41 s).
func TestLightTenantAtAnotherInstance(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 4*time.Millisecond
	rep := startSim(t, sc)
	top := redisTop(startRedis(t))
	floodAt := startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	lightAt := startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	light := `{"model":"sim-model","prompt":"hi","max_tokens":4,"ignore_eos":true,"stream":true}`
	flood := `{"model":"sim-model","prompt":"flood","max_tokens":100,"ignore_eos":true,"stream":true}`

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 24 {
		closedLoop(ctx, &wg, floodAt.api, keyAcme, flood, new(atomic.Int64))
	}
	defer func() { cancel(); wg.Wait() }()
	eventually(t, "batch learned", func() bool {
		return floodAt.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
	})
	eventually(t, "vLLM's queue drained", func() bool { return rep.Stats().Waiting == 0 })

	var flooded []time.Duration
	for range 30 {
		flooded = append(flooded, lightAt.ttftOf(t, keyBeta, light))
	}
	t.Logf("light TTFT at the other instance, in order: %v", flooded)
	later := slices.Clone(flooded[1:])
	slices.Sort(later)
	// One flood request runs 100 decode steps (≥ 400 ms): a light request
	// that waited for room would wait about one of those.
	assert.Less(t, later[len(later)*9/10], 250*time.Millisecond, "after its first, the light tenant's instance keeps its share of the batch")
	var paused []time.Duration
	for range 3 {
		time.Sleep(3 * time.Second) // the pause measured, not synchronisation
		paused = append(paused, lightAt.ttftOf(t, keyBeta, light))
	}
	t.Logf("after 3 s pauses: %v", paused)
	assert.Less(t, slices.Max(paused), 250*time.Millisecond, "the room kept for its peak is reported through its pauses")
}

// TestLightTenantsAtAnotherInstance: the isolation row split across two
// instances of a Redis fleet, at the scale of one replica whose batch is
// 8: a flood of 24 streams of 400 ms at one instance, and three light
// tenants of equal weight at the other, each sending 10 requests a second
// of about 170 ms, so that together they keep about 5 in flight: within
// their max-min shares (2 each of 8), more than their instance's half.
// Split by instance (shares 4 and 4), their queue grew until max_wait:
// p90 TTFT 5.3 s over 8 s. Split as the gate splits a pool on one
// instance (fleet.SeqShare: light tenants given their claims and a
// Poisson margin, the flood the rest; shares 1 and 7): p50 7–8 ms, p90
// about 50 ms and p99 about 290 ms when that was measured, where the same
// load at the flood's own instance read 8 ms, 31 ms and 268 ms (a wait
// for a completion). Under -race on 2026-12-07, six runs on two builds:
// p50 11–12 ms, p90 281–518 ms, p99 578–695 ms (the benchmark log). Those
// tails are the onset: the flood, alone until then, holds the whole
// batch, and its requests refilled before its instance's cap came (two
// exchanges after the light tenants' first) end together about 0.8 s in;
// the light tenants' queue drains by about 1.7 s. Sent after the first
// 2 s: p50 7–9 ms, p90 8–10 ms, p99 11–113 ms (three runs). The light
// tenants send for 30 s: about 20 s in, the flood's arrival rate over
// the gate's 20 s window has fallen to what its cap lets through, its
// gate reads it as no flood and its report reads light to the split;
// unless its standing queue binds it (gate.Gate.Stands), it takes the
// light tenants' room between their queues (sent 20–50 s in, 50 s runs:
// p99 185–213 ms unbound, 11–14 ms bound). The bounds below hold the
// whole run's p50 and p90, the p90 after the onset and the p99 after
// 20 s.
func TestLightTenantsAtAnotherInstance(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 4*time.Millisecond
	rep := startSim(t, sc)
	top := redisTop(startRedis(t))
	tenants := []fairTenant{{name: "flood", weight: 1}, {name: "v1", weight: 1}, {name: "v2", weight: 1}, {name: "v3", weight: 1}}
	floodAt := startNode(t, fairConfig(t, rep, top, "fleet", tenants))
	lightAt := startNode(t, fairConfig(t, rep, top, "fleet", tenants))
	light := `{"model":"sim-model","prompt":"hi","max_tokens":40,"ignore_eos":true,"stream":true}`
	flood := `{"model":"sim-model","prompt":"flood","max_tokens":100,"ignore_eos":true,"stream":true}`

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 24 {
		closedLoop(ctx, &wg, floodAt.api, tenants[0].key(), flood, new(atomic.Int64))
	}
	defer func() { cancel(); wg.Wait() }()
	eventually(t, "batch learned", func() bool {
		return floodAt.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
	})
	eventually(t, "vLLM's queue drained", func() bool { return rep.Stats().Waiting == 0 })

	var mu sync.Mutex
	var ttfts, steady, late []time.Duration
	var sent sync.WaitGroup
	tick := time.NewTicker(100 * time.Millisecond)
	for i := range 300 { // 30 s
		<-tick.C
		for _, v := range tenants[1:] {
			sent.Go(func() {
				d := lightAt.ttftOf(t, v.key(), light)
				mu.Lock()
				ttfts = append(ttfts, d)
				if i >= 20 { // sent after the onset's 2 s
					steady = append(steady, d)
				}
				if i >= 200 { // after 20 s: the flood reads as no flood
					late = append(late, d)
				}
				mu.Unlock()
			})
		}
	}
	tick.Stop()
	sent.Wait()
	// Read at an exchange, not once: the flood's report can read light at
	// one exchange (held at its cap, its gate sees it below its share).
	eventually(t, "the flood's instance's share binds the flood", func() bool {
		return slices.Contains(floodAt.replica(t).SeqBinds, "flood")
	})
	slices.Sort(ttfts)
	slices.Sort(steady)
	slices.Sort(late)
	q := func(ds []time.Duration, p float64) time.Duration { return ds[int(p*float64(len(ds)-1))] }
	t.Logf("light TTFT at the other instance over %d requests: p50 %v p90 %v p99 %v max %v; sent after the first 2 s (%d): p50 %v p90 %v p99 %v; after 20 s (%d): p90 %v p99 %v max %v; shares: flood's instance %v, light tenants' %v",
		len(ttfts), q(ttfts, 0.5), q(ttfts, 0.9), q(ttfts, 0.99), ttfts[len(ttfts)-1],
		len(steady), q(steady, 0.5), q(steady, 0.9), q(steady, 0.99),
		len(late), q(late, 0.9), q(late, 0.99), late[len(late)-1],
		floodAt.metric(t, "sluice_replica_seq_share", map[string]string{"replica": "r0"}),
		lightAt.metric(t, "sluice_replica_seq_share", map[string]string{"replica": "r0"}))
	// Split by instance the queue grows for the whole run (p50 410 ms,
	// p90 5.3 s); the bounds leave room for a loaded machine under -race,
	// where a request waits for a completion more often. After the onset
	// the light tenants' p90 is about 15 ms under -race: a bound there
	// catches a flood that takes their room between their queues, which
	// the onset's backlog hides from the whole run's p90.
	assert.Less(t, q(ttfts, 0.5), 150*time.Millisecond, "the light tenants' instance is shared what its tenants ask, not half the batch")
	assert.Less(t, q(ttfts, 0.9), time.Second, "the light tenants' instance is shared what its tenants ask, not half the batch")
	assert.Less(t, q(steady, 0.9), 250*time.Millisecond, "after the onset, the flood's instance keeps to its share")
	assert.Less(t, q(late, 0.99), 120*time.Millisecond, "a flood read as no flood, its queue standing, is bound at its part")
}

// TestLearnedBatchShortRequests: requests of about 200 ms, a flood at
// twice the capacity of a replica whose batch is 8 (max_num_seqs left
// out, the default scrape cadences). What waits inside vLLM drains within
// a fast scrape interval, so the scrape after a full one shows nothing
// waiting and the consecutive pair never forms; the ramp then overfills
// again. The batch is learned from two full scrapes at the same running
// count (fleet/sizing.go, recurScrapes), and from then on vLLM's queue
// stays near empty.
func TestLearnedBatchShortRequests(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 10*time.Millisecond
	rep := startSim(t, sc)
	cfg := nodeConfig(t, []*simReplica{rep}, "", "")
	cfg.Upstream.ScrapeInterval = time.Second // the defaults: the learning scrape, so the ramp
	n := startNode(t, cfg)
	flood := `{"model":"sim-model","prompt":"flood","max_tokens":20,"ignore_eos":true,"stream":true}`

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// 80 requests a second, open loop: twice the 8 / 200 ms it serves.
	openLoop(ctx, &wg, 12500*time.Microsecond, func() { n.complete(ctx, keyAcme, flood) })
	defer func() { cancel(); wg.Wait() }()

	eventually(t, "batch learned", func() bool {
		return n.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
	})
	eventually(t, "vLLM's queue drained", func() bool { return rep.Stats().Waiting == 0 })
	stop := sampleWaiting(rep)
	served := rep.Stats().Completed
	eventually(t, "100 more served with the batch learned", func() bool { return rep.Stats().Completed >= served+100 })
	most, mean := stop()
	t.Logf("vLLM waiting over 100 completions with the batch learned: mean %.3f most %d", mean, most)
	assert.Less(t, mean, 0.1, "nothing stands in vLLM's queue")
}

// TestRampBindsOnlyBesideOthers: with the ramp on (the learning scrape
// faster than the scrape) and no scrape during the test, an unlearned
// replica whose batch is 64 is sent rampMin (4) sequences past the most a
// scrape has shown it run (none). A tenant alone on its pool is not held
// to that: its burst of 32 all run at once, as without Sluice. Beside a
// tenant seen a moment ago the same burst gets 4, and 28 wait in Sluice's
// queue for the scrapes that show room (fleet/sizing.go, the ramp).
func TestRampBindsOnlyBesideOthers(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 64, 20*time.Millisecond
	job := `{"model":"sim-model","prompt":"job","max_tokens":200,"ignore_eos":true,"stream":true}`
	short := `{"model":"sim-model","prompt":"hi","max_tokens":2,"ignore_eos":true,"stream":true}`
	for _, beside := range []bool{false, true} {
		rep := startSim(t, sc)
		cfg := nodeConfig(t, []*simReplica{rep}, "    queue: {max_wait: 60s}\n", "")
		cfg.Upstream.ScrapeInterval, cfg.Upstream.LearnScrapeInterval = 10*time.Minute, 5*time.Minute
		n := startNode(t, cfg)
		if beside {
			n.ttftOf(t, keyBeta, short) // its demand peak is kept: it may only be pausing
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() { n.complete(ctx, keyAcme, job) })
		}
		acme := map[string]string{"tenant": "acme"}
		if beside {
			eventually(t, "28 queued in Sluice", func() bool { return n.metric(t, "sluice_queue_depth", acme) == 28 })
			assert.EqualValues(t, 4, n.metric(t, "sluice_inflight_requests", acme), "beside another tenant: the ramp's rampMin")
		} else {
			eventually(t, "all 32 running", func() bool { return rep.Stats().Running == 32 })
			assert.Zero(t, n.metric(t, "sluice_queue_depth", acme), "alone: nothing held back")
		}
		cancel()
		wg.Wait()
	}
}

// TestHeavyAboveThePool: a tenant asking two and a half times the pool
// (20 streams kept open on a replica of 8, max_num_seqs correct) while the
// only other tenant is pausing. Its max-min claim is the whole pool, and
// it asks less than three times that, so by the light margin alone it is
// light and holds all 8: the pausing tenant's next request waits for a
// completion. It asks more than the pool, so it is heavy
// (scheduler/gate, lightMargin) and leaves the pausing tenant's kept peak
// free (one sequence plus one Poisson deviation: 2 of 8): after its first
// 8 (sent before its averaged demand caught up) it holds at most 6, and
// the other tenant's request starts at once.
func TestHeavyAboveThePool(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 20*time.Millisecond
	rep := startSim(t, sc)
	cfg := nodeConfig(t, []*simReplica{rep}, "    queue: {max_wait: 60s}\n", "")
	cfg.Upstream.Replicas[0].MaxNumSeqs = 8
	noRamp := 0.0
	cfg.Upstream.LearnRamp = &noRamp // the room is the reserve's alone
	n := startNode(t, cfg)
	short := `{"model":"sim-model","prompt":"hi","max_tokens":2,"ignore_eos":true,"stream":true}`
	job := `{"model":"sim-model","prompt":"job","max_tokens":40,"ignore_eos":true,"stream":true}`
	n.ttftOf(t, keyBeta, short) // its demand peak is kept: it may only be pausing

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 20 {
		closedLoop(ctx, &wg, n.api, keyAcme, job, new(atomic.Int64))
	}
	// Its first wave (8 of 40 tokens, about 0.8 s) has ended and the next
	// ones started under the gate; then the replica (acme's alone while
	// beta pauses) is followed over 12 completions.
	eventually(t, "acme's first wave done", func() bool { return rep.Stats().Completed >= 1+16 })
	stop := sampleQueue(rep)
	served := rep.Stats().Completed
	eventually(t, "12 more served", func() bool { return rep.Stats().Completed >= served+12 })
	q := stop()
	ttft := n.ttftOf(t, keyBeta, short)
	cancel()
	wg.Wait()
	assert.LessOrEqual(t, q.mostRunning, int64(6), "the pausing tenant's peak and its deviation are left free")
	assert.Less(t, ttft, 300*time.Millisecond, "the pausing tenant's request starts at once, not after a completion (0.8 s)")
	t.Logf("acme's most running %d (mean %.2f); beta's TTFT %v", q.mostRunning, q.meanRunning, ttft)
}

// TestSteadyLoopBesideFlood: a closed loop of three clients (beta, under
// its share of a batch of eight, so light) beside an open-loop flood
// (acme) that the gate holds at the light tenants' reserve. A loop asks
// what it holds and never more, so the gate reserves it no Poisson noise
// (scheduler/gate steadyVar): the flood runs in the sequences the loop
// leaves, less server.headroom: the replica ran 6.9 of 8 on average.
// Reserved as a Poisson count's, three requests' noise kept the flood at
// about its floor request while four sequences stood idle: 3.4 of 8
// (measured with the rule turned off), the loop's own throughput the
// same. The gate reads a tenant's long-run rate over at least 10 s, so the
// loop reads steady only once it has run that long. What the gate keeps
// free for it reaches sluice_replica_reserve_ratio: 0.14 of the pool once
// steady, 0.65 with its noise.
func TestSteadyLoopBesideFlood(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 4*time.Millisecond
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	body := `{"model":"sim-model","prompt":"p","max_tokens":50,"ignore_eos":true}`

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var loopDone atomic.Int64
	for range 3 {
		closedLoop(ctx, &wg, n.api, keyBeta, body, &loopDone)
	}
	// The flood: 40 requests a second of 200 ms, five batches' worth.
	openLoop(ctx, &wg, 25*time.Millisecond, func() { n.complete(ctx, keyAcme, body) })
	eventually(t, "batch learned", func() bool {
		return n.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
	})
	eventually(t, "vLLM's queue drained", func() bool { return rep.Stats().Waiting == 0 })
	// The loop reads steady once its long-run rate has settled (gate's
	// longCorrection counts 10 s at least): wait for a 2 s window in which
	// the replica ran 6 or more on average (with the loop's noise reserved
	// it runs about 3.4 of 8 after the onset, and this times out).
	q, loops := besideLoop(t, rep, &loopDone, 40*time.Second, 6)
	t.Logf("running mean %.2f most %d, waiting mean %.3f; the loop completed %d in 5 s", q.meanRunning, q.mostRunning, q.meanWaiting, loops)
	assert.Greater(t, q.meanRunning, 6.0, "the loop's three and the flood in most of the rest")
	assert.Less(t, q.meanWaiting, 0.05, "nothing stands in vLLM's queue")
	assert.Greater(t, loops, int64(45), "the loop keeps its three going: about 75 of 200 ms in 5 s")
	// What the gate keeps free for the loop reaches the operator: about
	// one sequence (0.14 of 8) once the loop reads steady; its Poisson
	// noise read 0.65 before, and the gauge shows a span's most for 5-10 s.
	eventuallyWithin(t, 15*time.Second, "the reserve shown as it is", func() bool {
		r := n.metric(t, "sluice_replica_reserve_ratio", map[string]string{"replica": "r0"})
		return r > 0 && r < 0.25
	})
}

// TestSteadyLoopAtAnotherInstance: TestSteadyLoopBesideFlood's shape in
// front of two instances of a Redis fleet, the loop at one, the flood at
// the other. The share split keeps the loop's claim no Poisson margin
// once its gate reads it steady (its demand within two requests over the
// peak window: fleet.SplitPool, gate.Gate.Steady), so the flood's
// instance is given the sequences the loop leaves: the replica ran 6.9
// of 8, about 7 s in; 7.8, about 35 s in, under -race. Kept a margin of two deviations (f88eb36), the
// flood's instance was capped at one or two of the five and the replica
// never ran 6.5 over 2 s in 75 s.
func TestSteadyLoopAtAnotherInstance(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 4*time.Millisecond
	rep := startSim(t, sc)
	top := redisTop(startRedis(t))
	tenants := []fairTenant{{name: "flood", weight: 1}, {name: "loop", weight: 1}}
	floodAt := startNode(t, fairConfig(t, rep, top, "fleet", tenants))
	loopAt := startNode(t, fairConfig(t, rep, top, "fleet", tenants))
	body := `{"model":"sim-model","prompt":"p","max_tokens":50,"ignore_eos":true}`

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var loopDone atomic.Int64
	for range 3 {
		closedLoop(ctx, &wg, loopAt.api, tenants[1].key(), body, &loopDone)
	}
	openLoop(ctx, &wg, 25*time.Millisecond, func() { floodAt.complete(ctx, tenants[0].key(), body) })
	eventually(t, "batch learned", func() bool {
		return floodAt.metric(t, "sluice_replica_learned_batch", map[string]string{"replica": "r0"}) == 8
	})
	// Wait for a 2 s window in which the replica ran 6.5 or more: with
	// the loop's noise kept it never does, and this times out.
	q, loops := besideLoop(t, rep, &loopDone, 120*time.Second, 6.5)
	t.Logf("running mean %.2f most %d, waiting mean %.3f; the loop completed %d in 5 s; shares: flood's instance %v, loop's %v", q.meanRunning, q.mostRunning, q.meanWaiting, loops,
		floodAt.metric(t, "sluice_replica_seq_share", map[string]string{"replica": "r0"}), loopAt.metric(t, "sluice_replica_seq_share", map[string]string{"replica": "r0"}))
	assert.Greater(t, q.meanRunning, 6.0, "the loop's three and the flood in most of the rest")
	assert.Less(t, q.meanWaiting, 0.1, "nothing stands in vLLM's queue")
	assert.Greater(t, loops, int64(45), "the loop keeps its three going")
}

// besideLoop waits, up to within, for a 2 s window in which the replica
// ran at least running sequences on average, then samples it for a
// measured 5 s and returns that and the loop's completions in it.
func besideLoop(t *testing.T, rep *simReplica, loopDone *atomic.Int64, within time.Duration, running float64) (queueSample, int64) {
	t.Helper()
	eventuallyWithin(t, within, fmt.Sprintf("a 2 s window running %.1f on average", running), func() bool {
		s := sampleQueue(rep)
		time.Sleep(2 * time.Second) // a sampling window, not synchronisation
		return s().meanRunning >= running
	})
	l0, s := loopDone.Load(), sampleQueue(rep)
	time.Sleep(5 * time.Second) // the measured window
	return s(), loopDone.Load() - l0
}
