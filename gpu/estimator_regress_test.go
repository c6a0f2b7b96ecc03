package gpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A long run of requests of one shape (here a stream benchmark's 5-in,
// 64-out calls, with a rare burst of 5-in, 4-out ones) leaves one direction
// of the RLS covariance without excitation. Bounding only the diagonal let
// the off-diagonal outgrow it; the indefinite covariance then drove the
// coefficients up until a 4-token request's GPU-ms hold was 909,200 ms
// (λ 0.99, the default) and every request was refused as over the largest
// hold. With the covariance kept positive definite the hold stays within a
// few times the true cost (about 5 GPU-ms).
func TestEstimatorOneShapeStaysBounded(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	e := NewEstimator(0.01, 0.5, 0.99)
	worst := 0.0
	for i := range 200000 {
		in, out, g := int64(5), int64(64), 30+r.Float64()*60
		if i%3000 < 200 {
			out, g = 4, 3+r.Float64()*4
		}
		e.Observe(in, out, g)
		if v := e.Estimate(5, 4); v > worst {
			worst = v
		}
	}
	if worst > 100 {
		t.Fatalf("the hold of a 5-in, 4-out request reached %.0f GPU-ms (true cost about 5)", worst)
	}
	a, b := e.Coefficients()
	if a < 0 || b < 0.3 || b > 3 {
		t.Fatalf("coefficients a=%g b=%g: b should be near the 0.5..1.4 GPU-ms per output token fed", a, b)
	}
}

// Alternating phases of two request shapes (an edge benchmark's 1,500
// streams, then 3,000 short requests, four times): each phase forgets the
// other shape, so the first request of the next phase moves the
// coefficients far; clamping each coefficient at 0 separately lets the
// other compensate without bound (1e75 GPU-ms per token after one round,
// +Inf after four) and every request's hold overflows. So the step is cut
// to keep both coefficients non-negative.
func TestEstimatorAlternatingShapesStayBounded(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	e := NewEstimator(0.01, 0.5, 0.99)
	for round := range 4 {
		for range 1500 {
			e.Observe(5, 64, 1+r.Float64()*4)
		}
		if v := e.Estimate(5, 4); !(v >= 0 && v < 5) {
			t.Fatalf("round %d, after the streams: a 5-in, 4-out hold of %g GPU-ms (true cost about 0.35)", round, v)
		}
		for range 3000 {
			e.Observe(5, 4, 0.1+r.Float64()*0.5)
		}
		if v := e.Estimate(5, 64); !(v >= 0 && v < 30) {
			t.Fatalf("round %d, after the short requests: a 5-in, 64-out hold of %g GPU-ms (true cost about 3)", round, v)
		}
	}
}

// An observation no GPU could produce (or numerical failure) restarts the
// estimator from its seed instead of leaving coefficients that price every
// request out of the ledger's range.
func TestEstimatorInsaneObservationRestarts(t *testing.T) {
	e := NewEstimator(0.01, 0.5, 0.99)
	for range 10 {
		e.Observe(100, 100, 60)
	}
	e.Observe(5, 4, 1e300)
	a, b := e.Coefficients()
	if a != 0.01 || b != 0.5 {
		t.Fatalf("after an impossible observation the coefficients are a=%g b=%g, want the seed 0.01, 0.5", a, b)
	}
	// It keeps learning from there.
	for range 200 {
		e.Observe(100, 100, 60)
	}
	if v := e.Estimate(100, 100); math.Abs(v-60) > 6 {
		t.Fatalf("after the restart a 100+100 request is estimated at %g GPU-ms, want about 60", v)
	}
}
