package views

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestQuantileOverAWindow: percentiles count only the observations
// between two samples, interpolated inside a bucket as
// histogram_quantile does.
func TestQuantileOverAWindow(t *testing.T) {
	bounds := []float64{0.1, 0.5, 1}
	old := Hist{Bounds: bounds, Cum: []uint64{100, 100, 100}, Count: 100} // an old burst of fast ones
	cur := Hist{Bounds: bounds, Cum: []uint64{100, 110, 120}, Count: 120}
	assert.InDelta(t, 0.5, quantile(0.5, cur, old), 1e-9, "10 of the 20 new ones are in (0.1, 0.5]")
	assert.InDelta(t, 0.99, quantile(0.99, cur, old), 1e-9, "0.5 + 0.5 × 9.8/10")
	assert.True(t, math.IsNaN(quantile(0.5, old, old)), "nothing new: no percentile")
	assert.InDelta(t, 0.05, quantile(0.5, old, Hist{}), 1e-9, "since the start")
}

// TestRefusalLogKeepsTheLast: the page shows the newest refusals first,
// at most recentMax.
func TestRefusalLogKeepsTheLast(t *testing.T) {
	var l RefusalLog
	assert.Empty(t, l.Recent())
	for i := range recentMax + 5 {
		l.Add(Refusal{At: time.Unix(int64(i), 0), Status: 429 + i})
	}
	got := l.Recent()
	assert.Len(t, got, recentMax)
	assert.Equal(t, 429+recentMax+4, got[0].Status)
	assert.Equal(t, 429+5, got[recentMax-1].Status)
}
