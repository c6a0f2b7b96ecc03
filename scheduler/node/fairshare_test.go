package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testport"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// fairTenant is a tenant of a fleet fair-share run: its weight and the
// instances (by index) its clients send to.
type fairTenant struct {
	name   string
	weight int
	at     []int
}

func (ft fairTenant) key() string { return "sk-" + ft.name + "-fair-test-key" }

// fairConfig renders an instance's config: one replica, the Redis ledger
// (top), fair_share as given, and the tenants.
func fairConfig(t *testing.T, rep *simReplica, top, fairShare string, tenants []fairTenant) *config.File {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "upstream:\n  scrape_interval: 50ms\n  replicas:\n    - {name: r0, url: %q}\n", rep.url)
	b.WriteString("gpu: {telemetry: off}\n")
	fmt.Fprintf(&b, "server: {drain_timeout: 5s, fair_share: %s}\n", fairShare)
	b.WriteString(top)
	b.WriteString("tenants:\n")
	for _, ft := range tenants {
		fmt.Fprintf(&b, "  - name: %s\n    weight: %d\n    api_keys: [%q]\n", ft.name, ft.weight, config.HashKey(ft.key()))
	}
	cfg, err := config.Parse([]byte(b.String()))
	require.NoError(t, err, b.String())
	return cfg
}

// fairRun is what one fleet run served.
type fairRun struct {
	served  map[string]float64 // completions per tenant in the window
	seconds float64
	running float64 // the replica's mean running sequences over the window
}

// perWeight is each tenant's completions over its weight, relative to the
// least of them.
func (r fairRun) perWeight(tenants []fairTenant) map[string]float64 {
	out := map[string]float64{}
	least := 0.0
	for i, ft := range tenants {
		x := r.served[ft.name] / float64(ft.weight)
		out[ft.name] = x
		if i == 0 || x < least {
			least = x
		}
	}
	for k := range out {
		out[k] /= max(least, 1)
	}
	return out
}

func (r fairRun) goodput() float64 {
	total := 0.0
	for _, v := range r.served {
		total += v
	}
	return total / r.seconds
}

// minServed is the fewest completions of any tenant a window counts.
const minServed = 150

// settle is how long runFairFleet's clients run before its window.
const settle = 6 * time.Second

// runFairFleet starts n instances on one Redis in front of one simulated
// replica (8 sequences), keeps every tenant backlogged at each instance it
// reaches (clients per instance each sending one request after another),
// and counts the completions of each over window once every instance has
// exchanged (fair_share: fleet) or has run a while (local). top is the
// ledger's config (one Redis or a cluster).
func runFairFleet(t *testing.T, n int, top, fairShare string, tenants []fairTenant, clients int, window time.Duration) fairRun {
	t.Helper()
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 2*time.Millisecond
	rep := startSim(t, sc)
	nodes := make([]*node, n)
	for i := range nodes {
		nodes[i] = startNode(t, fairConfig(t, rep, top, fairShare, tenants))
		// Stop them as this run ends, so that runs in one test do not share a fleet.
		defer func() { require.NoError(t, nodes[i].stop()) }()
	}
	body := `{"model":"sim-model","prompt":"fair","max_tokens":24,"ignore_eos":true}`
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	counts := map[string]*atomic.Int64{}
	for _, ft := range tenants {
		c := &atomic.Int64{}
		counts[ft.name] = c
		for _, i := range ft.at {
			for range clients {
				closedLoop(ctx, &wg, nodes[i].api, ft.key(), body, c)
			}
		}
	}
	defer func() { cancel(); wg.Wait() }()
	for i, nd := range nodes {
		want := 0.0
		if fairShare == "fleet" {
			want = 1
		}
		eventually(t, fmt.Sprintf("instance %d's fair-share gauge reads %v", i, want), func() bool {
			return nd.metric(t, "sluice_fair_share_fleet", nil) == want
		})
	}
	// A fleet's first seconds are not its steady state: the gates'
	// averages rise from nothing, and until a flood's reaches the batch
	// the split may hold it light beside a flood at two instances whose
	// sum already passed it (heavy): the light one took the batch for
	// about a second, and the fleet's counters then repaid the other for
	// up to two more (SCHEDULING §9, "A fleet's first seconds"). The
	// window measures the steady split and order, so it starts past both.
	time.Sleep(settle) // a span, not synchronisation
	start := map[string]int64{}
	for k, c := range counts {
		start[k] = c.Load()
	}
	t0 := time.Now()
	stop := sampleQueue(rep)
	// The window is at least window and, on a loaded machine (make test
	// runs every package at once, with -race), long enough for the least
	// served tenant to complete enough requests that one more or less
	// does not move its share (at most a minute).
	enough := func() bool {
		for _, ft := range tenants {
			if counts[ft.name].Load()-start[ft.name] < minServed {
				return false
			}
		}
		return true
	}
	time.Sleep(window) // the span measured, not synchronisation
	for !enough() && time.Since(t0) < time.Minute {
		time.Sleep(100 * time.Millisecond) // extending the span measured, not synchronisation
	}
	running := stop().meanRunning
	if fairShare == "fleet" {
		for i, nd := range nodes {
			// A window with a fallback in it measures local fair share.
			require.Equal(t, 1.0, nd.metric(t, "sluice_fair_share_fleet", nil), "instance %d fell back to local fair share", i)
		}
	}
	run := fairRun{served: map[string]float64{}, seconds: time.Since(t0).Seconds(), running: running}

	for k, c := range counts {
		run.served[k] = float64(c.Load() - start[k])
	}
	return run
}

// TestFleetFairShareTwoInstances: two instances on one Redis in front of
// one replica; acme sends to both, beta (equally weighted) to the first
// only, both far past capacity. The batch split gives each tenant half,
// acme's half spread over its two instances: the first instance 6 of 8,
// the second 2 (fleet.SeqShare). Fair among each instance's own requests
// (fair_share: local, the order without the counters' exchange) the first
// splits its 6 evenly, so acme gets 5 to beta's 3 (1.67, measured
// 1.33–1.67; an even split by instance would give acme three times
// beta). With the fleet's counters they are served alike.
func TestFleetFairShareTwoInstances(t *testing.T) {
	tenants := []fairTenant{{name: "acme", weight: 1, at: []int{0, 1}}, {name: "beta", weight: 1, at: []int{0}}}
	local := runFairFleet(t, 2, redisTop(startRedis(t)), "local", tenants, 10, 4*time.Second)
	// 8 s, as the weighted test's: the service not yet exchanged, and a
	// loaded machine's refills, weigh too much in a 4 s window.
	fleet := runFairFleet(t, 2, redisTop(startRedis(t)), "fleet", tenants, 10, 8*time.Second)
	lr := local.served["acme"] / local.served["beta"]
	fr := fleet.served["acme"] / fleet.served["beta"]
	t.Logf("local: %v (acme/beta %.2f, %.1f req/s, batch %.2f); fleet: %v (acme/beta %.2f, %.1f req/s, batch %.2f; goodput %.3f of local)",
		local.served, lr, local.goodput(), local.running, fleet.served, fr, fleet.goodput(), fleet.running, fleet.goodput()/local.goodput())
	assert.Greater(t, lr, 1.2, "per instance, acme is served about 5/3 of beta (1.33–1.67 measured)")
	assert.InDelta(t, 1, fr, 0.25, "fleet-wide, acme and beta within 1.25 of each other")
	// Requests per second in one window follow the shared CPU's load (the
	// two arms run one after the other); BENCHMARKS.md compares them over
	// repeated runs. What the order must not do is leave the batch idle
	// (the order only chooses among queued requests, so it cannot; this
	// guards that, against the local arm's batch: both follow the CPU's
	// load, measured 5.4–7.2 at load averages of 10–30 on 2 cores, where
	// each instance's refill lags).
	assert.Greater(t, fleet.running, 0.6*local.running, "the replica's sequences stay as busy as with local fair share")
}

// TestFleetFairShareThreeInstancesWeighted: three instances in front of
// one replica; tenants weighted 1, 2 and 4 reach one, two and three
// instances (the lightest weight only the first). Fleet-wide, each is
// served its weight within 10 %. Each tenant has 24 clients per instance,
// more than three times its weighted share of the 8 sequences, so the
// dispatch gate counts every one as heavy: with 10, the weight-4 tenant
// is light on the first instance (10 < 3 × 4.6) and that instance keeps a
// reserve for it, parking the others (dispatch.go), which is the gate's
// isolation at work, not the order this test is about.
func TestFleetFairShareThreeInstancesWeighted(t *testing.T) {
	tenants := []fairTenant{{name: "one", weight: 1, at: []int{0}}, {name: "two", weight: 2, at: []int{0, 1}}, {name: "four", weight: 4, at: []int{0, 1, 2}}}
	local := runFairFleet(t, 3, redisTop(startRedis(t)), "local", tenants, 24, 4*time.Second)
	// The lightest tenant gets a seventh: about 20 requests a second. A
	// window is off by up to the service not yet exchanged (the bound's
	// 2(N−1)·U, half a second of an instance's dispatches); 8 s keeps
	// that within a few percent.
	fleet := runFairFleet(t, 3, redisTop(startRedis(t)), "fleet", tenants, 24, 8*time.Second)
	t.Logf("local: %v, per weight %v, %.1f req/s, batch %.2f; fleet: %v, per weight %v, %.1f req/s, batch %.2f (goodput %.3f of local)",
		local.served, local.perWeight(tenants), local.goodput(), local.running, fleet.served, fleet.perWeight(tenants), fleet.goodput(), fleet.running, fleet.goodput()/local.goodput())
	for name, x := range fleet.perWeight(tenants) {
		assert.InDeltaf(t, 1, x, 0.1, "%s: served per weight, relative to the least", name)
	}
}

// TestFleetFairShareOnCluster: the two-instance case with the ledger and
// the exchange on a three-node Redis Cluster.
func TestFleetFairShareOnCluster(t *testing.T) {
	addrs := startRedisCluster(t, 3)
	top := fmt.Sprintf("ledger: {backend: redis, redis: {addrs: [%s], store_timeout: 1s}}\n", `"`+strings.Join(addrs, `", "`)+`"`)
	tenants := []fairTenant{{name: "acme", weight: 1, at: []int{0, 1}}, {name: "beta", weight: 1, at: []int{0}}}
	// 8 s, for the same reason as TestFleetFairShareTwoInstances'.
	fleet := runFairFleet(t, 2, top, "fleet", tenants, 10, 8*time.Second)
	r := fleet.served["acme"] / fleet.served["beta"]
	t.Logf("cluster: %v (acme/beta %.2f, %.1f req/s, batch %.2f)", fleet.served, r, fleet.goodput(), fleet.running)
	assert.InDelta(t, 1, r, 0.25, "fleet-wide, acme and beta within 1.25 of each other")
}

// startRedisCluster starts n Redis Cluster primaries on loopback with an
// equal share of the slots and waits until every node reports the
// cluster ok; it returns their addresses.
func startRedisCluster(t *testing.T, n int) []string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found: run `make test` (scripts/ensure-deps.sh installs it)")
	}
	ctx := context.Background()
	addrs := make([]string, n)
	bus := make([]int, n)
	clients := make([]*redis.Client, n)
	for i := range n {
		port := testport.Free(t)
		bus[i] = testport.Free(t) // given, not port+10000, which may be taken or out of range
		addrs[i] = "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", t.TempDir(),
			"--save", "", "--appendonly", "no", "--protected-mode", "no", "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(bus[i]))
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		eventually(t, "redis-server listening on "+addrs[i], func() bool {
			c, err := net.Dial("tcp", addrs[i])
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		clients[i] = redis.NewClient(&redis.Options{Addr: addrs[i]})
		t.Cleanup(func() { _ = clients[i].Close() })
		require.NoError(t, clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", i*16384/n, (i+1)*16384/n-1).Err())
	}
	// Every node meets every other, so that none learns of a node only
	// through gossip, and the cluster is given 30 s to agree: under make
	// test's race-detector load a node once took more than 10 s to see
	// the cluster ok when only the first node met the others.
	for i := range n {
		for j := range n {
			if i != j {
				host, port, _ := net.SplitHostPort(addrs[j])
				require.NoError(t, clients[i].Do(ctx, "CLUSTER", "MEET", host, port, bus[j]).Err())
			}
		}
	}
	for i, c := range clients {
		eventuallyWithin(t, 30*time.Second, fmt.Sprintf("cluster node %d sees the cluster ok", i), func() bool {
			info, err := c.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r")
		})
	}
	return addrs
}

// closedLoop starts one client that sends body to api's completions with
// key until ctx ends, counting the 200s in ok.
func closedLoop(ctx context.Context, wg *sync.WaitGroup, api, key, body string, ok *atomic.Int64) {
	wg.Go(func() {
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, "POST", api+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ok.Add(1)
			}
		}
	})
}
