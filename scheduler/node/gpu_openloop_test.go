package node

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/promsum"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// meteredConfig is nodeConfig with vLLM-metrics telemetry (the simulator's
// busy and energy counters meter the replica) and a large gpu_ms budget on
// both tenants, so that the ledger's committed GPU-ms can be read back.
func meteredConfig(t *testing.T, rep *simReplica) *config.File {
	t.Helper()
	budget := "    budgets: [{dimension: gpu_ms, limit: 1000000000000, window: 24h}]\n"
	var b strings.Builder
	// max_num_seqs as the simulator's: what does not fit waits in Sluice's
	// queue, not in vLLM's, where it would hold a share without running.
	fmt.Fprintf(&b, "upstream:\n  scrape_interval: 50ms\n  replicas:\n    - {name: r0, url: %q, max_num_seqs: %d}\n", rep.url, rep.Config().MaxNumSeqs)
	b.WriteString("gpu: {telemetry: vllm}\nserver: {drain_timeout: 5s}\n")
	fmt.Fprintf(&b, "tenants:\n  - name: acme\n    api_keys: [%q]\n    concurrency: 64\n%s", config.HashKey(keyAcme), budget)
	fmt.Fprintf(&b, "  - name: beta\n    api_keys: [%q]\n    concurrency: 64\n%s", config.HashKey(keyBeta), budget)
	cfg, err := config.Parse([]byte(b.String()))
	require.NoError(t, err, b.String())
	return cfg
}

// committedGPUMs reads a tenant's committed gpu_ms from the admin API.
func (n *node) committedGPUMs(t *testing.T, tenant string) int64 {
	t.Helper()
	req, _ := http.NewRequest("GET", n.adminURL+"/admin/tenants/"+tenant+"/usage", nil)
	req.Header.Set("Authorization", "Bearer "+keyAdmin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var u struct {
		Limits []struct {
			Dimension string `json:"dimension"`
			Committed int64  `json:"committed"`
		} `json:"limits"`
	}
	require.NoError(t, json.Unmarshal(readAll(t, resp), &u))
	for _, l := range u.Limits {
		if l.Dimension == "gpu_ms" {
			return l.Committed
		}
	}
	t.Fatalf("no gpu_ms limit for %s", tenant)
	return 0
}

// TestGPUMsConservationOpenLoop: two tenants send open-loop Poisson traffic
// of mixed sizes, acme twice beta's work, at about 30, 60 and 90 % replica
// utilisation. Σ per-tenant GPU-ms is within 1 % of the simulator's busy
// time, acme gets 2× beta's GPU-ms within 7 %, and the same holds for
// energy: attributed + unattributed joules are the simulator's energy, the
// unattributed part being intervals without work (idle is never charged).
func TestGPUMsConservationOpenLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("35 s of open-loop load")
	}
	// Steps cost 2 ms per sequence in the batch (plus 0.2 ms), as decode
	// does on a GPU: the replica is a processor-sharing server, busy
	// λ·E[work] of the time, and a request's GPU time is close to its
	// tokens × 2 ms whatever it shares the batch with, so "twice the work"
	// is twice the GPU time up to the sharing of the 0.2 ms. Requests are
	// long (15–60 ms of work) against the scheduler's own per-request
	// latency, which counts as running time in the shares.
	const perSeq = 2 * time.Millisecond
	sizes := []int{8, 16, 32}
	meanS := 0.0
	for _, k := range sizes {
		meanS += float64(k) * perSeq.Seconds() / float64(len(sizes))
	}
	for _, target := range []float64{0.3, 0.6, 0.9} {
		t.Run(fmt.Sprintf("util%.0f", target*100), func(t *testing.T) {
			sc := sim.DefaultConfig()
			sc.DecodeStep = 200 * time.Microsecond
			sc.DecodeStepPerSeq = perSeq
			rep := startSim(t, sc)
			n := startNode(t, meteredConfig(t, rep))
			// The counters' baseline: a scrape reached the meter.
			eventually(t, "first metered scrape", func() bool {
				return n.metric(t, "sluice_replica_gpu_energy_joules_total", map[string]string{"replica": "r0"}) > 0
			})
			e0, busy0 := rep.EnergyJoules(), rep.Stats().BusyTime
			lambda := target / meanS
			rng := rand.New(rand.NewPCG(uint64(target*100), 15))
			// Exactly twice the work: beta gets each size 16 times, acme 32
			// times; tenants and sizes are shuffled so that neither tenant's
			// requests sit at fixed places in the arrival stream.
			type job struct {
				key string
				k   int
			}
			var jobs []job
			for _, k := range sizes {
				for range 16 {
					jobs = append(jobs, job{keyBeta, k}, job{keyAcme, k}, job{keyAcme, k})
				}
			}
			rng.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
			start := time.Now()
			var wg sync.WaitGroup
			next := start
			for _, jb := range jobs {
				next = next.Add(time.Duration(rng.ExpFloat64() / lambda * float64(time.Second)))
				if d := time.Until(next); d > 0 {
					time.Sleep(d) // the open-loop arrival process itself, not a synchronisation
				}
				key, k := jb.key, jb.k
				body := fmt.Sprintf(`{"model":"sim-model","prompt":[1,2,3,4,5,6,7,8],"max_tokens":%d,"ignore_eos":true}`, k)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r := n.call(t, "/v1/completions", key, body); r.StatusCode != 200 {
						t.Errorf("status %d: %s", r.StatusCode, r.Body)
					}
				}()
			}
			wg.Wait()
			wall := time.Since(start)
			eventually(t, "replica idle", func() bool { return rep.Stats().Running == 0 })
			busy := rep.Stats().BusyTime - busy0
			// The meter has closed the last interval once Sluice's busy total
			// reaches the simulator's counter.
			eventually(t, "meter caught up", func() bool {
				got := n.metric(t, "sluice_replica_gpu_busy_seconds_total", map[string]string{"replica": "r0"})
				return math.Abs(got-rep.Stats().BusyTime.Seconds()) < 1e-6
			})
			energy := rep.EnergyJoules() - e0
			// One gather, so that the replica's totals and the tenants' are
			// of the same instant (idle power keeps metering).
			mfs, err := n.reg.Gather()
			require.NoError(t, err)
			once := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return mfs, nil })
			get := func(name, label, value string) float64 {
				v, err := promsum.Sum(once, name, map[string]string{label: value})
				require.NoError(t, err)
				return v
			}
			acme, beta := get("sluice_tenant_gpu_ms_total", "tenant", "acme"), get("sluice_tenant_gpu_ms_total", "tenant", "beta")
			acmeJ, betaJ := get("sluice_tenant_gpu_joules_total", "tenant", "acme"), get("sluice_tenant_gpu_joules_total", "tenant", "beta")
			unattJ := get("sluice_replica_gpu_unattributed_joules_total", "replica", "r0")
			meterJ := get("sluice_replica_gpu_energy_joules_total", "replica", "r0")
			busyMs := float64(busy) / float64(time.Millisecond)
			var ledgerMs int64
			eventually(t, "settled", func() bool {
				ledgerMs = n.committedGPUMs(t, "acme") + n.committedGPUMs(t, "beta")
				return ledgerMs > 0
			})
			t.Logf("utilisation %.2f (target %.2f) over %s: acme %.1f + beta %.1f = %.1f GPU-ms (ratio %.3f); simulator busy %.1f ms; ledger %d GPU-ms",
				busyMs/float64(wall.Milliseconds()), target, wall.Round(time.Millisecond), acme, beta, acme+beta, acme/beta, busyMs, ledgerMs)
			t.Logf("energy: acme %.1f + beta %.1f J (ratio %.3f) + unattributed %.1f J = %.1f J metered; simulator %.1f J since the first scrape",
				acmeJ, betaJ, acmeJ/betaJ, unattJ, acmeJ+betaJ+unattJ, energy)
			assert.InEpsilon(t, busyMs, acme+beta, 0.01, "Σ tenant GPU-ms vs the simulator's busy time")
			// A request that ended just after a scrape still has its share of
			// the next interval (idle power only), closed and exported within
			// a poll or two.
			eventually(t, "attributed + unattributed = metered", func() bool {
				mfs, err = n.reg.Gather()
				require.NoError(t, err)
				acmeJ, betaJ = get("sluice_tenant_gpu_joules_total", "tenant", "acme"), get("sluice_tenant_gpu_joules_total", "tenant", "beta")
				unattJ = get("sluice_replica_gpu_unattributed_joules_total", "replica", "r0")
				meterJ = get("sluice_replica_gpu_energy_joules_total", "replica", "r0")
				return math.Abs(meterJ-(acmeJ+betaJ+unattJ)) <= 1e-6*meterJ
			})
			// The test reads the simulator's energy at other instants than the
			// scrapes that bound the metered span; idle power fills the gap.
			assert.InEpsilon(t, energy, meterJ, 0.05, "metered vs the simulator's energy")
			// Every busy joule is attributed: dynamic energy is in the tenants'.
			assert.GreaterOrEqual(t, acmeJ+betaJ, 0.99*630*busy.Seconds(), "busy energy attributed")

			// Twice the work is twice the GPU time only while the meter
			// measures work: the simulator counts a late engine goroutine's
			// lost time as busy (as a GPU's counter would see a stalled
			// batch), so on a host too loaded to keep the step cadence the
			// stalls, not the tokens, decide who used more, and the recent
			// rate that settlement uses swings with them. Work here is at
			// most Σ (k−1) decode steps × 2.2 ms; a calm host meters within
			// 1 % of it.
			var workMs float64
			for _, jb := range jobs {
				workMs += float64(jb.k-1) * float64(perSeq+sc.DecodeStep) / float64(time.Millisecond)
			}
			if busyMs > 1.03*workMs {
				t.Skipf("host stalled the simulator (busy %.0f ms for at most %.0f ms of work): conservation checked; ratio %.3f and settlement %+.1f %% not judged",
					busyMs, workMs, acme/beta, 100*(float64(ledgerMs)/busyMs-1))
			}
			// 7 %: the shares count Sluice's own per-request latency as
			// running time, which a loaded CI host stretches for 15 ms
			// requests (a run at 90 % read 1.89 with the simulator on
			// cadence); the double discount this guards against read 1.8.
			assert.InEpsilon(t, 2.0, acme/beta, 0.07, "acme/beta GPU-ms")
			assert.InEpsilon(t, 2.0, acmeJ/betaJ, 0.07, "acme/beta joules")
			assert.InEpsilon(t, busyMs, float64(ledgerMs), 0.05, "Σ settled GPU-ms (the open interval at the recent rate)")
		})
	}
}
