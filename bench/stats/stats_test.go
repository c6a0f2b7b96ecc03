package stats

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/workload"
)

const ms1 = time.Millisecond

func TestPercentileNumpyLinear(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   []float64
		p    float64
		want float64 // np.percentile(in, p)
	}{
		{"empty", nil, 99, 0},
		{"one", []float64{7}, 99, 7},
		{"p90 of 1..4", []float64{1, 2, 3, 4}, 90, 3.7},
		{"p40", []float64{15, 20, 35, 40, 50}, 40, 29},
		{"p99 of 1..10", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 9.91},
		{"p50 even", []float64{1, 3}, 50, 2},
		{"p100", []float64{1, 3, 9}, 100, 9},
		{"p0", []float64{1, 3, 9}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.InDelta(t, tc.want, Percentile(tc.in, tc.p), 1e-9)
		})
	}
	assert.Equal(t, "99", PWord(99))
	assert.Equal(t, "99.9", PWord(99.9))
}

func slo(ttft float64) workload.SLO { return workload.SLO{TTFTMs: &ttft} }

// handExample: three requests of one tenant (SLO TTFT ≤ 150 ms).
//
//	A: sent 0, choices events at 100 (empty text), 120, 150; 3 tokens, 10 in.
//	B: sent 50, one event at 250; 1 token, 20 in.
//	C: sent 60, rejected queue_full at 61.
func handExample() (*workload.Schedule, *loadgen.Result) {
	plans := []workload.Plan{{Name: "a", Weight: 1, Role: "victim", SLO: slo(150), Cost: workload.Cost{Input: 1, Output: 2}}}
	recs := []loadgen.Record{
		{Tenant: 0, Intended: 0, Sent: 0, First: 100 * ms1, FirstContent: 120 * ms1, Done: 150 * ms1, ITL: []time.Duration{20 * ms1, 30 * ms1},
			InTokens: 10, InIntended: 10, OutTokens: 3, OutIntended: 3, Chunks: 3, Outcome: loadgen.Success},
		{Tenant: 0, Intended: 50 * ms1, Sent: 50 * ms1, First: 250 * ms1, FirstContent: 250 * ms1, Done: 250 * ms1,
			InTokens: 20, InIntended: 20, OutTokens: 1, OutIntended: 1, Chunks: 1, Outcome: loadgen.Success},
		{Tenant: 0, Intended: 60 * ms1, Sent: 60 * ms1, First: -1, FirstContent: -1, Done: 61 * ms1, InTokens: 5, InIntended: 5,
			OutIntended: 4, Status: 429, Outcome: loadgen.Rejected, Reason: "queue_full"},
	}
	return &workload.Schedule{Tenants: plans, Requests: make([]workload.Request, 3)}, &loadgen.Result{Records: recs}
}

func TestHandComputedMetrics(t *testing.T) {
	t.Parallel()
	sc, run := handExample()
	res := Analyze(sc, run, Options{Percentiles: []float64{50, 99}})
	s := res.Summary
	assert.InDelta(t, 0.25, s.Duration, 1e-12, "first send → last completion")
	assert.Equal(t, 2, s.Completed)
	assert.Equal(t, 1, s.Failed)
	assert.Equal(t, 3, s.Sent)
	assert.Equal(t, 30, s.TotalInputTokens)
	assert.Equal(t, 4, s.TotalOutputTokens)
	assert.InDelta(t, 8.0, s.RequestThroughput, 1e-9)
	assert.InDelta(t, 16.0, s.OutputThroughput, 1e-9)
	assert.InDelta(t, 136.0, s.TotalTokenThroughput, 1e-9)
	// TTFT: [100, 200]
	assert.InDelta(t, 150.0, s.TTFT.Mean, 1e-9)
	assert.InDelta(t, 150.0, s.TTFT.Median, 1e-9)
	assert.InDelta(t, 50.0, s.TTFT.Std, 1e-9)
	assert.InDelta(t, 199.0, s.TTFT.P["99"], 1e-9)
	// TPOT: only A (3 tokens): (150−100)/(3−1) = 25; B has 1 token and is left out.
	assert.Equal(t, 1, s.TPOT.N)
	assert.InDelta(t, 25.0, s.TPOT.Mean, 1e-9)
	assert.InDelta(t, 25.0, s.TPOT.P["99"], 1e-9)
	// E2EL: [150, 200]; the trailing usage chunk does not move it.
	assert.InDelta(t, 175.0, s.E2EL.Mean, 1e-9)
	assert.InDelta(t, 25.0, s.E2EL.Std, 1e-9)
	assert.InDelta(t, 199.5, s.E2EL.P["99"], 1e-9)
	// ITL pooled: [20, 30]; empty first chunk still counts (TTFT at 100, not 120).
	assert.Equal(t, 2, s.ITL.N)
	assert.InDelta(t, 25.0, s.ITL.Mean, 1e-9)
	assert.InDelta(t, 5.0, s.ITL.Std, 1e-9)
	assert.InEpsilon(t, 20.0, s.ITL.Median, 0.001)
	assert.InEpsilon(t, 30.0, s.ITL.P["99"], 0.001)
	// Goodput: A meets TTFT ≤ 150, B (200) does not.
	assert.Equal(t, 1, s.Good)
	assert.InDelta(t, 4.0, s.RequestGoodput, 1e-9)
	assert.InDelta(t, 12.0, s.TokenGoodput, 1e-9)
	assert.InDelta(t, 1.0/3, s.SLOAttainment, 1e-9, "good / sent")
	assert.InDelta(t, 1.4, s.Concurrency, 1e-9, "(0.15+0.2)/0.25")
	assert.InDelta(t, 4.0, s.MaxOutputTokensPerS, 0)
	assert.Equal(t, 2, s.MaxConcurrentRequests)
	assert.Equal(t, 1, s.TTFTContentDiffers)
	assert.Zero(t, s.EarlyEmptyChunks)
	for _, w := range res.Schedule.Warnings {
		assert.NotContains(t, w, "empty chunk", "ttft ≠ ttft_content alone (vLLM's chat role chunk) warns of nothing")
	}
	assert.Equal(t, map[string]map[string]int{"success": {"": 2}, "rejected": {"queue_full": 1}}, s.Outcomes)
	// From arrival: B was sent on time, so same as TTFT here.
	assert.InDelta(t, 150.0, res.FromArrival.TTFT.Mean, 1e-9)
	// Cost: demand = (10+6)+(20+2)+(5+8) = 51; served = 16+22 = 38.
	assert.InDelta(t, 51.0, res.Tenants[0].Share.Demand, 1e-9)
	assert.InDelta(t, 38.0, res.Tenants[0].Share.Served, 1e-9)
	assert.InDelta(t, 1.0, res.Tenants[0].Share.X, 1e-9, "only tenant: allocation = capacity = served")
	assert.InDelta(t, 1.0, res.Fairness.JainShare, 0)
}

func TestEmptyDistributionsAreZero(t *testing.T) {
	t.Parallel()
	s := Summarize(nil, nil, 0, []float64{99})
	assert.Zero(t, s.TTFT.Mean)
	assert.Zero(t, s.TTFT.P["99"])
	assert.Zero(t, s.ITL.P["99"])
	assert.Zero(t, s.RequestThroughput)
}

func TestWaterFill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		d, w   []float64
		c      float64
		want   []float64
		lambda float64
	}{
		{"light tenant served in full", []float64{1, 10, 10}, []float64{1, 1, 1}, 11, []float64{1, 5, 5}, 5},
		{"weights", []float64{10, 10}, []float64{1, 3}, 8, []float64{2, 6}, 2},
		{"all fit", []float64{1, 2}, []float64{1, 1}, 10, []float64{1, 2}, math.Inf(1)},
		{"zero demand ignored", []float64{0, 4}, []float64{1, 1}, 2, []float64{0, 2}, 2},
		{"no capacity", []float64{3, 4}, []float64{1, 1}, 0, []float64{0, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, l := WaterFill(tc.d, tc.w, tc.c)
			assert.InDeltaSlice(t, tc.want, got, 1e-9)
			assert.InDelta(t, tc.lambda, l, 1e-9)
		})
	}
}

func TestJain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"single", []float64{0.3}, 1},
		{"equal", []float64{1, 1, 1}, 1},
		{"one starved", []float64{1, 0}, 0.5},
		{"2:1", []float64{1, 0.5}, 0.9},
		{"all zero", []float64{0, 0}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.InDelta(t, tc.want, Jain(tc.xs), 1e-12)
		})
	}
}

// TestFairnessTwoTenants: a sends 2 requests of cost 20 (all served), b 4
// (one served). C = 60, λ = 30: x_a = 40/30, x_b = 20/30; J = 0.9.
func TestFairnessTwoTenants(t *testing.T) {
	t.Parallel()
	plans := []workload.Plan{
		{Name: "a", Weight: 1, Role: "victim", Cost: workload.Cost{Input: 1, Output: 2}},
		{Name: "b", Weight: 1, Role: "aggressor", Cost: workload.Cost{Input: 1, Output: 2}},
	}
	rec := func(tenant int, at time.Duration, ok bool) loadgen.Record {
		r := loadgen.Record{Tenant: tenant, Intended: at, Sent: at, First: -1, FirstContent: -1, Done: at + 10*ms1, InTokens: 10,
			InIntended: 10, OutIntended: 5, Outcome: loadgen.Rejected, Reason: "queue_full"}
		if ok {
			r.First, r.FirstContent, r.OutTokens, r.Outcome, r.Reason = at+5*ms1, at+5*ms1, 5, loadgen.Success, ""
		}
		return r
	}
	run := &loadgen.Result{Records: []loadgen.Record{
		rec(0, 0, true), rec(1, 0, true), rec(1, 100*ms1, false), rec(0, 200*ms1, true), rec(1, 300*ms1, false), rec(1, 400*ms1, false),
	}}
	res := Analyze(&workload.Schedule{Tenants: plans}, run, Options{})
	a, b := res.Tenants[0].Share, res.Tenants[1].Share
	assert.InDelta(t, 40.0, a.Demand, 1e-9)
	assert.InDelta(t, 80.0, b.Demand, 1e-9)
	assert.InDelta(t, 30.0, a.Alloc, 1e-9)
	assert.InDelta(t, 30.0, b.Alloc, 1e-9)
	assert.InDelta(t, 4.0/3, a.X, 1e-9)
	assert.InDelta(t, 2.0/3, b.X, 1e-9)
	assert.True(t, b.Backlogged)
	assert.True(t, a.Backlogged, "a demanded 40 > λ=30")
	assert.InDelta(t, 0.9, res.Fairness.JainShare, 1e-9)
	assert.InDelta(t, 20.0, res.Fairness.MaxServiceDiff, 1e-9, "b: min(40, 80) − 20")
	require.NotNil(t, res.Victims)
	assert.Equal(t, 2, res.Victims.Completed)
	assert.Equal(t, 3, res.Tenants[1].Summary.Outcomes["rejected"]["queue_full"])
	assert.InDelta(t, 1.0, res.Tenants[0].Summary.SLOAttainment, 0)
	assert.InDelta(t, 0.25, res.Tenants[1].Summary.SLOAttainment, 0)
	assert.InDelta(t, 25.0/34, res.Fairness.JainSLOAttainment, 1e-9, "(1.25)²/(2·1.0625)")
}

func TestServiceDiffCapsByDemand(t *testing.T) {
	t.Parallel()
	plans := []workload.Plan{{Name: "a", Weight: 1, Cost: workload.Cost{Output: 1}}, {Name: "b", Weight: 2, Cost: workload.Cost{Output: 1}}}
	mk := func(tenant int, at time.Duration, out int) *loadgen.Record {
		return &loadgen.Record{Tenant: tenant, Intended: at, Sent: at, First: at, Done: at, OutIntended: out, OutTokens: out, Outcome: loadgen.Success}
	}
	// Window 2 s. a gets 100 in second 0; b (weight 2) asks and gets only 10 → normalised 5.
	recs := []*loadgen.Record{mk(0, 0, 100), mk(1, 0, 10), mk(0, 1500*ms1, 100)}
	maxGap, mean := ServiceDiff(plans, recs, 0, 2*time.Second)
	assert.InDelta(t, 0.0, maxGap, 1e-9, "b's deficit is capped by its own demand")
	assert.InDelta(t, 0.0, mean, 1e-9)
	recs = append(recs, &loadgen.Record{Tenant: 1, Intended: 500 * ms1, Sent: 500 * ms1, Done: 600 * ms1, OutIntended: 300, Outcome: loadgen.Rejected})
	maxGap, _ = ServiceDiff(plans, recs, 0, 2*time.Second)
	assert.InDelta(t, 150.0, maxGap, 1e-9, "top a = 200; b demand 310/2 = 155 → min(200, 155) − 5")
}
