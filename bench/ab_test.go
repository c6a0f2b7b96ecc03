package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/bench/report"
)

func TestABWarnings(t *testing.T) {
	t.Parallel()
	doc := func(chunks, toks, peak float64) report.Doc {
		return report.Doc{"total_chunks": chunks, "total_output_tokens": toks, "max_concurrent_requests": peak}
	}
	for _, tc := range []struct {
		name string
		r    ABResult
		want []string
	}{
		{"same chunking", ABResult{A: []report.Doc{doc(100, 100, 10)}, B: []report.Doc{doc(105, 100, 10)}}, nil},
		{"B buffers", ABResult{A: []report.Doc{doc(100, 100, 10)}, B: []report.Doc{doc(50, 100, 10)}},
			[]string{"chunks per token differ: A 1.000, B 0.500 (a hop buffers or re-chunks SSE)"}},
		{"A queues in vLLM", ABResult{A: []report.Doc{doc(100, 100, 400)}, B: []report.Doc{doc(100, 100, 10)}},
			[]string{"A run 0: peak 400 in flight over 2 replicas is far above max-num-seqs 64: A measures vLLM's queue"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, abWarnings(&tc.r, 2, 64))
		})
	}
}
