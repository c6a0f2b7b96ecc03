package node

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/vllm/sim"
)

// cpuTime is the process's user+system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCPUPerRequest is the in-process version of scripts/bench.sh
// section 2: 16 clients send small non-streamed completions (4 tokens)
// against the simulator (1 ms decode steps), directly and through Sluice.
// The process's CPU time (client, simulator and, for sluice, the server) is
// divided by the requests; Sluice's own cost is sluice − direct
// (cpu-µs/req of the two sub-benchmarks). Each iteration is a batch.
func BenchmarkCPUPerRequest(b *testing.B) {
	const clients, perClient = 16, 25
	cfg := sim.DefaultConfig()
	cfg.DecodeStep = time.Millisecond
	rep := startSim(b, cfg)
	n := startNode(b, nodeConfig(b, []*simReplica{rep}, "", ""))
	c := benchClient()
	body := []byte(smallCompletion)
	for range 50 {
		postOnce(b, c, rep.url, body)
		postOnce(b, c, n.api, body)
	}
	for _, tc := range []struct{ name, url string }{{"direct", rep.url}, {"sluice", n.api}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var cpu time.Duration
			reqs := 0
			for b.Loop() {
				start := cpuTime(b)
				var wg sync.WaitGroup
				for range clients {
					wg.Go(func() {
						for range perClient {
							postOnce(b, c, tc.url, body)
						}
					})
				}
				wg.Wait()
				cpu += cpuTime(b) - start
				reqs += clients * perClient
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(reqs), "cpu-µs/req")
		})
	}
}
