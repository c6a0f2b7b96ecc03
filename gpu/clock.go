package gpu

import (
	"math"
	"math/bits"
	"sync"
	"time"
)

// ppm is the fixed-point scale of utilisation: 1e6 = fully busy.
const ppm = 1_000_000

// Ticket is a request's start mark on a [Clock], returned by [Clock.Start]
// and passed back to [Clock.End] exactly once.
type Ticket struct{ v uint64 }

// Clock is a replica's virtual GPU clock (SCHEDULING §8): V advances at
// u·g/n while n > 0, so a request's GPU time is V(end) − V(start), and the
// sum over requests equals ∫u·g dt over the replica's busy time. Safe for
// concurrent use (one mutex; every method is O(1) and allocation-free).
//
// # Design rationale
//
// V is kept in whole GPU-nanoseconds. Each advance computes the exact
// numerator u[ppm]·g·dt[ns] in 128 bits, adds the carried residue, divides by
// 1e6·n and carries the remainder, so rounding never loses or creates GPU
// time: Σ attributed·1e6 = Σ numerators − final residue, where the residue
// is below 1e6·n (under n GPU-ns in all).
type Clock struct {
	gpus uint64 // immutable: g

	mu    sync.Mutex // guards everything below
	last  time.Time  // time of the last advance
	u     uint64     // utilisation in ppm, held since last
	auto  bool       // u unknown: count 1 while anything runs, else 0
	n     int64      // local running requests
	ext   int64      // running requests reported by vLLM (shared replicas, §9)
	v     uint64     // virtual clock, GPU-ns per request
	res   uint64     // residue in ppm·GPU-ns, < 1e6·max(n, ext)
	busy  acc        // ∫u·g dt over all time, GPU-ns
	unatt acc        // ∫u·g dt while n = 0, GPU-ns
}

// acc accumulates ppm·ns numerators as whole ns plus a residue.
type acc struct{ ns, res uint64 }

func (a *acc) add(hi, lo uint64) {
	lo, c := bits.Add64(lo, a.res, 0)
	hi += c
	if hi >= ppm {
		hi = ppm - 1 // beyond 2^64 ns: cannot happen for sane intervals
	}
	q, r := bits.Div64(hi, lo, ppm)
	a.ns += q
	a.res = r
}

// NewClock returns a clock for a replica with g GPUs (g < 1 counts as 1),
// idle (u = 0) until the first [Clock.SetUtilization].
func NewClock(g int, now time.Time) *Clock {
	return &Clock{gpus: uint64(max(g, 1)), last: now}
}

// advanceLocked moves the clock to now under the held u and n. Caller holds mu.
func (c *Clock) advanceLocked(now time.Time) {
	dt := now.Sub(c.last)
	if dt <= 0 {
		return // same instant, or a clock that stepped back: nothing elapsed
	}
	c.last = now
	n := uint64(max(c.n, c.ext))
	u := c.u
	if c.auto {
		u = 0
		if n > 0 {
			u = ppm
		}
	}
	if u == 0 {
		return
	}
	hi, lo := bits.Mul64(u*c.gpus, uint64(dt))
	c.busy.add(hi, lo)
	if c.n == 0 {
		c.unatt.add(hi, lo)
		if n == 0 {
			return
		}
	}
	lo, carry := bits.Add64(lo, c.res, 0)
	hi += carry
	d := ppm * n
	if hi >= d {
		hi = d - 1
	}
	q, r := bits.Div64(hi, lo, d)
	c.v += q
	c.res = r
}

// Start marks a request's dispatch at now and counts it running.
func (c *Clock) Start(now time.Time) Ticket {
	c.mu.Lock()
	c.advanceLocked(now)
	c.n++
	t := Ticket{v: c.v}
	c.mu.Unlock()
	return t
}

// End marks the request's completion (or abort) at now and returns its GPU
// time in GPU-nanoseconds. Call exactly once per [Clock.Start].
func (c *Clock) End(now time.Time, t Ticket) int64 {
	c.mu.Lock()
	c.advanceLocked(now)
	if c.n > 0 {
		c.n--
	}
	d := c.v - t.v
	c.mu.Unlock()
	return int64(d)
}

// Elapsed returns the GPU-ns a running request has used so far, for the
// overrun abort (§8); it does not end the request.
func (c *Clock) Elapsed(now time.Time, t Ticket) int64 {
	c.mu.Lock()
	c.advanceLocked(now)
	d := c.v - t.v
	c.mu.Unlock()
	return int64(d)
}

// SetUtilization sets u (clamped to at most 1) from now on. A negative or
// NaN u means unknown: the clock then counts the replica fully busy while
// any request runs and idle otherwise (wall-clock attribution).
func (c *Clock) SetUtilization(now time.Time, u float64) {
	c.mu.Lock()
	c.advanceLocked(now)
	c.auto = !(u >= 0)
	c.u = 0
	if !c.auto {
		c.u = uint64(math.Round(min(u, 1) * ppm))
	}
	c.mu.Unlock()
}

// SetExternalRunning sets the running count vLLM reports for a replica
// shared with other Sluice instances; the clock divides by max(local, ext).
func (c *Clock) SetExternalRunning(now time.Time, n int64) {
	c.mu.Lock()
	c.advanceLocked(now)
	c.ext = max(n, 0)
	c.mu.Unlock()
}

// ClockTotals are a clock's cumulative figures.
type ClockTotals struct {
	// BusyGPUNs is ∫u·g dt since creation.
	BusyGPUNs int64
	// UnattributedGPUNs is the part of BusyGPUNs with no running request.
	UnattributedGPUNs int64
	// Running is the local running count.
	Running int64
}

// Totals advances the clock to now and returns its totals.
func (c *Clock) Totals(now time.Time) ClockTotals {
	c.mu.Lock()
	c.advanceLocked(now)
	t := ClockTotals{BusyGPUNs: int64(c.busy.ns), UnattributedGPUNs: int64(c.unatt.ns), Running: c.n}
	c.mu.Unlock()
	return t
}

// GPUMs converts GPU-ns to whole GPU-ms (the ledger's unit), rounding to
// nearest, half up.
//
// # Design rationale
//
// Rounding up would bias short requests (a 0.2 ms request would settle as
// 1 ms) and break the fleet-wide Σ GPU-ms ≈ busy GPU time check; nearest
// rounding errs by at most 0.5 ms per request with zero mean. The exact
// figure stays available in GPU-ns (and in sluice_tenant_gpu_ms_total,
// which [AttributionMetrics.Settle] feeds unrounded).
func GPUMs(gpuNs int64) int64 {
	if gpuNs <= 0 {
		return 0
	}
	return (gpuNs + 500_000) / 1_000_000
}
