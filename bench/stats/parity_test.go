package stats

import (
	"encoding/json"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/workload"
)

// TestVLLMParity feeds the outputs of testdata/vllm_parity.json to
// Summarize and compares every metric with what vLLM's calculate_metrics
// computed from the same outputs with numpy (testdata/vllm_parity.py).
// Exact metrics match to 1e-8 relative (nanosecond clock); ITL percentiles come from the HDR
// histogram (3 significant digits) and match within 0.1 %.
func TestVLLMParity(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/vllm_parity.json")
	require.NoError(t, err)
	var fx struct {
		Goodput     map[string]float64 `json:"goodput"`
		Percentiles []float64          `json:"percentiles"`
		Duration    float64            `json:"duration"`
		Outputs     []struct {
			Success      bool      `json:"success"`
			StartTime    float64   `json:"start_time"`
			PromptLen    int       `json:"prompt_len"`
			TTFT         float64   `json:"ttft"`
			ITL          []float64 `json:"itl"`
			Latency      float64   `json:"latency"`
			OutputTokens int       `json:"output_tokens"`
		} `json:"outputs"`
		VLLM map[string]float64 `json:"vllm"`
	}
	require.NoError(t, json.Unmarshal(b, &fx))
	ns := func(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
	ttft, tpot := fx.Goodput["ttft"], fx.Goodput["tpot"]
	plans := []workload.Plan{{Name: "t", Weight: 1, SLO: workload.SLO{TTFTMs: &ttft, TPOTMs: &tpot}}}
	recs := make([]*loadgen.Record, len(fx.Outputs))
	for i, o := range fx.Outputs {
		r := &loadgen.Record{Sent: ns(o.StartTime), InTokens: o.PromptLen, InIntended: o.PromptLen, Outcome: loadgen.Error,
			Reason: "http_500", First: -1, FirstContent: -1}
		r.Done = r.Sent
		if o.Success {
			r.Outcome, r.Reason = loadgen.Success, ""
			r.First = r.Sent + ns(o.TTFT)
			r.FirstContent = r.First
			r.OutTokens = o.OutputTokens
			r.Chunks = len(o.ITL) + 1
			for _, g := range o.ITL {
				r.ITL = append(r.ITL, ns(g))
			}
			r.Done = r.Sent + ns(o.Latency)
		}
		recs[i] = r
	}
	s := Summarize(plans, recs, fx.Duration, fx.Percentiles)
	got := map[string]float64{
		"completed": float64(s.Completed), "failed": float64(s.Failed), "total_input_tokens": float64(s.TotalInputTokens),
		"total_output_tokens": float64(s.TotalOutputTokens), "request_throughput": s.RequestThroughput,
		"request_goodput": s.RequestGoodput, "output_throughput": s.OutputThroughput,
		"total_token_throughput": s.TotalTokenThroughput, "max_output_tokens_per_s": s.MaxOutputTokensPerS,
		"max_concurrent_requests": float64(s.MaxConcurrentRequests),
	}
	for name, d := range map[string]Dist{"ttft": s.TTFT, "tpot": s.TPOT, "itl": s.ITL, "e2el": s.E2EL} {
		got["mean_"+name+"_ms"], got["std_"+name+"_ms"], got["median_"+name+"_ms"] = d.Mean, d.Std, d.Median
		for k, v := range d.P {
			got["p"+k+"_"+name+"_ms"] = v
		}
	}
	require.Len(t, got, len(fx.VLLM), "same keys as vLLM")
	for k, want := range fx.VLLM {
		tol := 1e-8 // times are int64 ns here, floats in vLLM: ≤ 0.5 ns apart
		if k == "median_itl_ms" || (len(k) > 7 && k[0] == 'p' && k[len(k)-7:] == "_itl_ms") {
			tol = 1e-3 // HDR, 3 significant digits
		}
		v, ok := got[k]
		require.True(t, ok, "missing %s", k)
		if want == 0 {
			assert.InDelta(t, 0, v, 1e-12, k)
			continue
		}
		assert.InEpsilon(t, want, v, tol, "%s: got %v, vLLM %v", k, v, want)
	}
}
