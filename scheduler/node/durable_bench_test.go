package node

// BenchmarkDurableDefault measures what the durable default costs: a
// config file's directory is its data_dir, so the embedded ledger is
// journaled (fsync every_op: group commit, one fsync wait per request, at
// its MarkDispatched) unless the operator writes data_dir: "".
// Four nodes in one process share one simulator: journal every_op (the
// default), ledger.fsync group (the same but for the bound on unsynced
// entries), data_dir without the ledger journal, and memory only, plus the
// simulator direct.
// Rounds interleave the targets (the order rotates each round) so all see
// the same machine noise; each round sends durableN small non-streamed
// completions per target at a fixed concurrency. Reports medians over the
// rounds: req/s, p50/p99 latency, and ratios to memory only. Run it with
// -benchtime=1x (a b.Loop iteration is all the rounds).

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/vllm/sim"
)

// durableEnv reads an integer knob from the environment.
func durableEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func BenchmarkDurableDefault(b *testing.B) {
	rounds := durableEnv("DURABLE_ROUNDS", 5)
	perRound := durableEnv("DURABLE_N", 1000)
	conc := durableEnv("DURABLE_C", 16)
	cfg := sim.DefaultConfig()
	cfg.DecodeStep = 100 * time.Microsecond
	rep := startSim(b, cfg)
	reps := []*simReplica{rep}
	budget := "    budgets: [{dimension: tokens, limit: 1000000000, window: 24h}]\n"
	journal := startNode(b, nodeConfig(b, reps, budget, fmt.Sprintf("data_dir: %q\n", b.TempDir())))
	group := startNode(b, nodeConfig(b, reps, budget, fmt.Sprintf("data_dir: %q\nledger: {fsync: group}\n", b.TempDir())))
	memory := startNode(b, nodeConfig(b, reps, budget, "data_dir: \"\"\n"))
	// nojournal: the rest of data_dir (admin state, pending writes), the
	// ledger in memory: what the journal alone costs.
	nojournal := startNode(b, nodeConfig(b, reps, budget, fmt.Sprintf("data_dir: %q\nledger: {journal: \"\"}\n", b.TempDir())))
	targets := []struct{ name, url string }{{"direct", rep.url}, {"memory", memory.api}, {"journal", journal.api}, {"group", group.api}, {"nojournal", nojournal.api}}
	c := benchClient()
	body := []byte(smallCompletion)

	type res struct{ rps, p50, p99 float64 }
	got := map[string][]res{}
	run := func(url string) res {
		lat := make([][]time.Duration, conc)
		var wg sync.WaitGroup
		start := time.Now()
		for w := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perRound / conc {
					lat[w] = append(lat[w], postOnce(b, c, url, body))
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		all := slices.Concat(lat...)
		return res{rps: float64(len(all)) / el.Seconds(), p50: pctUS(all, 50), p99: pctUS(all, 99)}
	}
	for _, t := range targets { // warm connections, pools and journals
		for range 2 * conc {
			postOnce(b, c, t.url, body)
		}
	}
	for b.Loop() {
		for r := range rounds {
			for i := range targets {
				t := targets[(i+r)%len(targets)]
				got[t.name] = append(got[t.name], run(t.url))
			}
		}
	}
	med := func(name string, f func(res) float64) float64 {
		v := make([]float64, 0, len(got[name]))
		for _, x := range got[name] {
			v = append(v, f(x))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	rps := func(x res) float64 { return x.rps }
	p50 := func(x res) float64 { return x.p50 }
	p99 := func(x res) float64 { return x.p99 }
	for _, t := range targets {
		b.ReportMetric(med(t.name, rps), t.name+"-req/s")
		b.ReportMetric(med(t.name, p50), t.name+"-p50-µs")
		b.ReportMetric(med(t.name, p99), t.name+"-p99-µs")
		if os.Getenv("DURABLE_RAW") != "" {
			b.Logf("%s: %+v", t.name, got[t.name])
		}
	}
	// Ratios per round (the same round's machine noise), then medians.
	ratio := func(name string, f func(res) float64) float64 {
		v := []float64{}
		for i := range got[name] {
			v = append(v, f(got[name][i])/f(got["memory"][i]))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, n := range []string{"journal", "group", "nojournal"} {
		b.ReportMetric(ratio(n, rps), n+"/memory-req/s")
		b.ReportMetric(ratio(n, p50), n+"/memory-p50")
		b.ReportMetric(med(n, p50)-med("direct", p50), n+"-added-p50-µs")
		b.ReportMetric(med(n, p99)-med("direct", p99), n+"-added-p99-µs")
	}
	b.ReportMetric(med("memory", p50)-med("direct", p50), "memory-added-p50-µs")
	b.ReportMetric(med("memory", p99)-med("direct", p99), "memory-added-p99-µs")
}
