package gpu

import (
	"math"
	"sync"
	"sync/atomic"
)

// estScale normalises token counts so the RLS covariance stays well
// conditioned: features are thousands of tokens.
const estScale = 1000

// Estimator learns gpu_ms ≈ a·input_tokens + b·output_tokens for one replica
// by recursive least squares with forgetting, seeded with (a, b) and clamped
// to a, b ≥ 0 (SCHEDULING §8). Observe is serialised by a mutex; reads
// ([Estimator.Coefficients], [Estimator.Estimate]) are lock-free. Safe for
// concurrent use.
type Estimator struct {
	lambda float64 // immutable forgetting factor

	mu    sync.Mutex    // guards theta and p
	theta [2]float64    // coefficients on features scaled by 1/estScale
	p     [2][2]float64 // covariance
	seed  [2]float64    // theta at construction, where a reset restarts

	coef atomic.Pointer[[2]float64] // published (a, b) in GPU-ms per token
}

// NewEstimator returns an estimator seeded with a and b (GPU-ms per input
// and output token) and forgetting factor lambda in (0, 1].
func NewEstimator(a, b, lambda float64) *Estimator {
	e := &Estimator{lambda: lambda}
	e.theta = [2]float64{min(max(a, 0), maxCoef) * estScale, min(max(b, 0), maxCoef) * estScale}
	e.seed = e.theta
	e.p = priorP
	e.publishLocked()
	return e
}

// priorP is a moderate prior: the seed counts for about as much as a few
// requests.
var priorP = [2][2]float64{{10, 0}, {0, 10}}

// maxCoef bounds a coefficient, in GPU-ms per token: 100 s of one GPU per
// token is beyond any model on any replica. An estimate past it (or not
// finite, or a covariance no longer positive definite) is numerical
// failure, not a cost: the estimator restarts from its seed rather than
// price every request out of the ledger's range.
const maxCoef = 1e5

// saneLocked reports whether theta and p are usable.
func (e *Estimator) saneLocked() bool {
	for i := range 2 {
		if t := e.theta[i]; !(t >= 0 && t <= maxCoef*estScale) {
			return false
		}
		if d := e.p[i][i]; !(d > 0 && d <= 1e6) {
			return false
		}
	}
	return !math.IsNaN(e.p[0][1]) && e.p[0][1]*e.p[0][1] < e.p[0][0]*e.p[1][1]
}

func (e *Estimator) publishLocked() {
	c := [2]float64{e.theta[0] / estScale, e.theta[1] / estScale}
	e.coef.Store(&c)
}

// Observe feeds one completed request's actual GPU-ms. Requests with no
// tokens, or non-finite or negative GPU-ms, are ignored.
func (e *Estimator) Observe(input, output int64, gpuMs float64) {
	if input < 0 || output < 0 || input+output == 0 || !(gpuMs >= 0) || math.IsInf(gpuMs, 0) {
		return
	}
	x := [2]float64{float64(input) / estScale, float64(output) / estScale}
	e.mu.Lock()
	defer e.mu.Unlock()
	// px = P·x; k = px / (λ + xᵀ·P·x)
	px := [2]float64{e.p[0][0]*x[0] + e.p[0][1]*x[1], e.p[1][0]*x[0] + e.p[1][1]*x[1]}
	den := e.lambda + x[0]*px[0] + x[1]*px[1]
	k := [2]float64{px[0] / den, px[1] / den}
	errv := gpuMs - (e.theta[0]*x[0] + e.theta[1]*x[1])
	// Step along k·err only as far as both coefficients stay >= 0. Clamping
	// each at 0 instead left the other one compensating without bound: the
	// pair diverged (1e75 GPU-ms per token after 1,500 streams and 3,000
	// short requests) and every hold overflowed (TestEstimatorOneShapeStaysBounded).
	step := 1.0
	for i := range 2 {
		if d := k[i] * errv; e.theta[i]+d < 0 {
			step = min(step, e.theta[i]/-d)
		}
	}
	e.theta[0] = max(e.theta[0]+step*k[0]*errv, 0)
	e.theta[1] = max(e.theta[1]+step*k[1]*errv, 0)
	// P = (P − k·(P·x)ᵀ) / λ, kept symmetric.
	for i := range 2 {
		for j := range 2 {
			e.p[i][j] = (e.p[i][j] - k[i]*px[j]) / e.lambda
		}
	}
	sym := (e.p[0][1] + e.p[1][0]) / 2
	e.p[0][1], e.p[1][0] = sym, sym
	// Keep the covariance bounded when a direction gets no excitation for
	// long (forgetting would otherwise blow it up), and positive definite:
	// bounding the diagonal alone left the off-diagonal free to outgrow it
	// (a run of requests of one shape, such as a stream benchmark), and an
	// indefinite P drives the coefficients to 1e7 GPU-ms per token, a hold
	// no request fits (TestEstimatorOneShapeStaysBounded).
	for i := range 2 {
		if e.p[i][i] > 1e6 {
			e.p[i][i] = 1e6
		}
	}
	if lim := 0.99 * math.Sqrt(e.p[0][0]*e.p[1][1]); math.Abs(e.p[0][1]) > lim {
		e.p[0][1] = math.Copysign(lim, e.p[0][1])
		e.p[1][0] = e.p[0][1]
	}
	if !e.saneLocked() {
		e.theta, e.p = e.seed, priorP
	}
	e.publishLocked()
}

// Coefficients returns the current (a, b) in GPU-ms per token.
func (e *Estimator) Coefficients() (a, b float64) {
	c := e.coef.Load()
	return c[0], c[1]
}

// Estimate returns a·input + b·output in GPU-ms.
func (e *Estimator) Estimate(input, output int64) float64 {
	a, b := e.Coefficients()
	return a*float64(input) + b*float64(output)
}
