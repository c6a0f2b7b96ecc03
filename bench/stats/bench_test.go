package stats

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/workload"
)

// BenchmarkAnalyze10k analyses 10,000 requests of 4 tenants, 128 chunks each.
func BenchmarkAnalyze10k(b *testing.B) {
	plans := make([]workload.Plan, 4)
	for i := range plans {
		plans[i] = workload.Plan{Name: string(rune('a' + i)), Weight: 1, Cost: workload.Cost{Input: 1, Output: 2}}
	}
	itl := make([]time.Duration, 127)
	for i := range itl {
		itl[i] = 20*time.Millisecond + time.Duration(i)*time.Microsecond
	}
	recs := make([]loadgen.Record, 10000)
	for i := range recs {
		at := time.Duration(i) * 30 * time.Millisecond
		recs[i] = loadgen.Record{Tenant: i % 4, Intended: at, Sent: at, First: at + 200*time.Millisecond,
			FirstContent: at + 200*time.Millisecond, Done: at + 200*time.Millisecond + 127*20*time.Millisecond, ITL: itl,
			InTokens: 1024, InIntended: 1024, OutTokens: 128, OutIntended: 128, Chunks: 128, Outcome: loadgen.Success}
	}
	sc := &workload.Schedule{Tenants: plans}
	run := &loadgen.Result{Records: recs}
	b.ReportAllocs()
	for b.Loop() {
		_ = Analyze(sc, run, Options{})
	}
}
