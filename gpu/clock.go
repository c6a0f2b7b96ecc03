package gpu

import (
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Use is an amount of GPU usage: busy GPU time and GPU energy.
type Use struct {
	// GPUNs is busy GPU time in GPU-nanoseconds.
	GPUNs int64
	// EnergyUJ is GPU energy in microjoules.
	EnergyUJ int64
}

func (u Use) plus(v Use) Use { return Use{u.GPUNs + v.GPUNs, u.EnergyUJ + v.EnergyUJ} }

// shareScale is the fixed-point scale of the share clock S: a request alone
// on a replica gains shareScale units per nanosecond.
const shareScale = 16

// Ticket is a request's mark on a [Clock], returned by [Clock.Start] and
// passed back to [Clock.End] exactly once.
type Ticket struct{ r *run }

// run is one request on a clock. Guarded by the clock's mutex.
type run struct {
	tenant string
	s0     uint64 // S where its not yet attributed part starts
	s1     uint64 // S at its end; valid when done
	done   bool
	att    Use // attributed through closed intervals
	i      int // index in Clock.runs
}

// checkpoint is the share clock's state from at until the next checkpoint.
type checkpoint struct {
	at       time.Time
	s, res   uint64 // S and its residue at at
	loc, all uint64 // ∫ n dS and ∫ m dS at at
	n, m     uint64 // local running count and max(n, ext) from at on
}

// Clock attributes a replica's GPU time and energy to the requests that ran
// on it (SCHEDULING §8, gpu/doc.go "GPU-milliseconds"). Busy time and
// energy arrive per sample interval ([Clock.Close]); each interval's amount
// is split over the requests that ran in it in proportion to their share of
// it, 1/m per instant (m = max(local running, vLLM's running on a shared
// replica)), so that the requests' amounts add up to what the meter saw.
// Safe for concurrent use (one mutex).
//
// # Design rationale
//
// The share clock S advances by shareScale·dt/m while m > 0, with a carried
// residue, and a request's share of an interval is the S it saw inside it.
// Every event (Start, End, a change of m) writes a checkpoint, so an
// interval may end at a sample time already in the past (a scrape read the
// counter before the scheduler heard of it) and S at that time is still
// exact. An interval's amount q is split as floor(q·share/Σshare) in 128-bit
// integers, Σshare counting every instance's requests; what floors and
// other instances leave is reported as unattributed, so attributed +
// unattributed = q to the nanosecond and microjoule.
type Clock struct {
	gpus uint64 // immutable: g
	// sink receives each interval's attribution per tenant. Set before
	// first use ([Monitor] does); nil records nothing.
	sink func(tenant string, u Use)

	mu     sync.Mutex // guards everything below
	last   time.Time  // time of the last advance
	n, ext int64      // local running, and vLLM's running (shared replicas)
	s, res uint64     // share clock and its residue (< m)
	loc    uint64     // ∫ n dS: Σ of every local request's share
	all    uint64     // ∫ m dS: Σ of every instance's requests' share
	log    []checkpoint
	runs   []*run         // running, and ended with a part still open
	byT    map[string]Use // scratch for closeLocked's per-tenant sums

	closedAt time.Time
	closedS  uint64
	closedA  uint64 // all at closedAt
	pending  Use    // amounts of samples that ended at or before closedAt
	exact    bool   // no busy signal: busy = g while any request runs
	// The settle-time rate of the open interval: recent intervals' amounts
	// over their shares, exponentially weighted (rateDecay per interval).
	haveRate bool
	rateQ    [2]float64 // weighted Σ GPU-ns and µJ
	rateA    float64    // weighted Σ share units

	tot ClockTotals
}

// NewClock returns a clock for a replica with g GPUs (g < 1 counts as 1).
// It starts in exact mode (busy while a request runs) until a sampled
// [Clock.Close].
func NewClock(g int, now time.Time) *Clock {
	c := &Clock{gpus: uint64(max(g, 1)), last: now, closedAt: now, exact: true, byT: map[string]Use{}}
	c.log = append(c.log, checkpoint{at: now})
	return c
}

func (c *Clock) mLocked() uint64 { return uint64(max(c.n, c.ext, 0)) }

// advanceLocked moves S to now. Caller holds mu.
func (c *Clock) advanceLocked(now time.Time) {
	dt := now.Sub(c.last)
	if dt <= 0 {
		return // same instant, or a clock that stepped back: nothing elapsed
	}
	c.last = now
	m := c.mLocked()
	if m == 0 {
		return
	}
	num := uint64(dt)*shareScale + c.res
	d := num / m
	c.s += d
	c.res = num % m
	c.loc += uint64(max(c.n, 0)) * d
	c.all += m * d
}

// checkpointLocked records the state after a change of n or ext. Caller
// holds mu and has advanced to c.last.
func (c *Clock) checkpointLocked() {
	cp := checkpoint{at: c.last, s: c.s, res: c.res, loc: c.loc, all: c.all, n: uint64(max(c.n, 0)), m: c.mLocked()}
	if k := len(c.log) - 1; k >= 0 && c.log[k].at.Equal(cp.at) {
		c.log[k] = cp
		return
	}
	c.log = append(c.log, cp)
}

// atLocked returns S and ∫ m dS at t, closedAt ≤ t ≤ last. Caller holds mu.
func (c *Clock) atLocked(t time.Time) (s, all uint64) {
	i, _ := slices.BinarySearchFunc(c.log, t, func(cp checkpoint, t time.Time) int { return cp.at.Compare(t) })
	// i is the first checkpoint at or after t; use the one in force at t.
	if i == len(c.log) || c.log[i].at.After(t) {
		i--
	}
	if i < 0 {
		i = 0
	}
	cp := c.log[i]
	if cp.m == 0 || !t.After(cp.at) {
		return cp.s, cp.all
	}
	d := (uint64(t.Sub(cp.at))*shareScale + cp.res) / cp.m
	return cp.s + d, cp.all + cp.m*d
}

// Start marks a request of tenant dispatched at now and counts it running.
func (c *Clock) Start(now time.Time, tenant string) Ticket {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advanceLocked(now)
	c.n++
	c.checkpointLocked()
	r := &run{tenant: tenant, s0: c.s, i: len(c.runs)}
	c.runs = append(c.runs, r)
	return Ticket{r: r}
}

// End marks the request's completion (or abort) at now and returns the
// figure to settle: what closed intervals attributed to it, plus its share
// of the open interval at the last interval's rate. In exact mode the
// interval closes at now and the figure is exact. Call exactly once per
// [Clock.Start]; a zero Ticket returns zero.
func (c *Clock) End(now time.Time, t Ticket) Use {
	r := t.r
	if r == nil {
		return Use{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.done {
		return r.att
	}
	c.advanceLocked(now)
	c.n--
	c.checkpointLocked()
	r.done, r.s1 = true, c.s
	if c.exact {
		c.closeLocked(c.last, Use{})
		return r.att
	}
	return r.att.plus(c.tailLocked(r.s1 - r.s0))
}

// rateDecay weights closed intervals for the settle-time rate: each older
// interval counts 0.8 of the next, so about the last five dominate. A ratio
// of sums, not a mean of ratios, so that a short interval whose sample
// caught a neighbour's work does not swing it.
const rateDecay = 0.8

// tailLocked estimates the use of share units of the open interval at the
// recent intervals' rate (before any interval with work: busy on every
// GPU, no energy). Caller holds mu.
func (c *Clock) tailLocked(units uint64) Use {
	if !c.haveRate {
		return Use{GPUNs: int64(units * c.gpus / shareScale)}
	}
	f := float64(units) / c.rateA
	return Use{GPUNs: int64(math.Round(f * c.rateQ[0])), EnergyUJ: int64(math.Round(f * c.rateQ[1]))}
}

// Close ends the sample interval at at with the busy GPU time and energy
// the replica's meter saw in it (negative amounts count as 0) and splits
// them over the requests that ran in it. A sample that ends at or before
// the previous one is added to the next. Closing switches the clock to
// sampled mode.
func (c *Clock) Close(at time.Time, q Use) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exact = false
	c.closeLocked(at, Use{GPUNs: max(q.GPUNs, 0), EnergyUJ: max(q.EnergyUJ, 0)})
}

// CloseExact ends the interval at now for a replica without a busy signal:
// its busy time is g for every instant a request runs (wall-clock
// attribution), with no energy. It switches the clock to exact mode, in
// which every End closes the interval too.
func (c *Clock) CloseExact(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exact = true
	c.closeLocked(now, Use{})
}

// Baseline ends the interval at at with wall-clock attribution, as
// [Clock.CloseExact], and switches to sampled mode: the replica's counters
// start at at, and the next [Clock.Close] carries their delta since.
func (c *Clock) Baseline(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exact = true
	c.closeLocked(at, Use{})
	c.exact = false
}

// closeLocked closes the open interval at at. In exact mode q's busy time
// is g × the interval's running time. Caller holds mu.
func (c *Clock) closeLocked(at time.Time, q Use) {
	if at.After(c.last) {
		c.advanceLocked(at)
	}
	if !at.After(c.closedAt) {
		c.pending = c.pending.plus(q)
		return
	}
	q = q.plus(c.pending)
	c.pending = Use{}
	sAt, allAt := c.atLocked(at)
	all := allAt - c.closedA // Σ share of every instance's requests
	if c.exact {
		q.GPUNs = int64(all * c.gpus / shareScale)
	}
	var given Use
	for k := len(c.runs) - 1; k >= 0; k-- {
		r := c.runs[k]
		end := sAt
		if r.done {
			end = min(r.s1, sAt)
		}
		if end > r.s0 && all > 0 {
			sh := min(end-r.s0, all)
			a := Use{GPUNs: split(q.GPUNs, sh, all), EnergyUJ: split(q.EnergyUJ, sh, all)}
			if a != (Use{}) {
				r.att = r.att.plus(a)
				given = given.plus(a)
				if c.sink != nil {
					c.byT[r.tenant] = c.byT[r.tenant].plus(a)
				}
			}
		}
		r.s0 = max(r.s0, sAt)
		if r.done && r.s1 <= sAt {
			// Wholly inside closed intervals: swap-remove.
			last := c.runs[len(c.runs)-1]
			c.runs[k], last.i = last, k
			c.runs[len(c.runs)-1] = nil
			c.runs = c.runs[:len(c.runs)-1]
		}
	}
	for tenant, u := range c.byT {
		c.sink(tenant, u)
	}
	clear(c.byT)
	if all > 0 {
		c.rateQ[0] = c.rateQ[0]*rateDecay + float64(q.GPUNs)
		c.rateQ[1] = c.rateQ[1]*rateDecay + float64(q.EnergyUJ)
		c.rateA = c.rateA*rateDecay + float64(all)
		c.haveRate = true
	}
	c.tot.BusyGPUNs += q.GPUNs
	c.tot.UnattributedGPUNs += q.GPUNs - given.GPUNs
	c.tot.EnergyUJ += q.EnergyUJ
	c.tot.UnattributedEnergyUJ += q.EnergyUJ - given.EnergyUJ
	c.closedAt, c.closedS, c.closedA = at, sAt, allAt
	// Keep the checkpoint in force at at and everything after it.
	i, _ := slices.BinarySearchFunc(c.log, at, func(cp checkpoint, t time.Time) int { return cp.at.Compare(t) })
	if i == len(c.log) || c.log[i].at.After(at) {
		i--
	}
	if i > 0 {
		c.log = slices.Delete(c.log, 0, i)
	}
}

// split returns floor(q·sh/all) for 0 ≤ sh ≤ all, all > 0, in 128 bits.
func split(q int64, sh, all uint64) int64 {
	if q <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(q), sh)
	v, _ := bits.Div64(hi, lo, all) // hi < all since sh ≤ all
	return int64(v)
}

// SetExternalRunning sets the running count vLLM reports for a replica
// shared with other Sluice instances; shares divide by max(local, ext).
func (c *Clock) SetExternalRunning(now time.Time, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advanceLocked(now)
	c.ext = max(n, 0)
	c.checkpointLocked()
}

// ClockTotals are a clock's cumulative figures over closed intervals.
type ClockTotals struct {
	// BusyGPUNs is the busy GPU time of all closed intervals.
	BusyGPUNs int64
	// UnattributedGPUNs is the part of BusyGPUNs no local request got:
	// intervals without work, other instances' share, rounding.
	UnattributedGPUNs int64
	// EnergyUJ and UnattributedEnergyUJ are the same for energy.
	EnergyUJ, UnattributedEnergyUJ int64
	// Running is the local running count.
	Running int64
}

// Totals returns the clock's totals over the intervals closed so far.
func (c *Clock) Totals() ClockTotals {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.tot
	t.Running = c.n
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
// figure stays available in sluice_tenant_gpu_ms_total, which the clock
// feeds unrounded.
func GPUMs(gpuNs int64) int64 {
	if gpuNs <= 0 {
		return 0
	}
	return (gpuNs + 500_000) / 1_000_000
}

// MilliJoules converts microjoules to whole millijoules (the ledger's
// gpu_joules unit), rounding to nearest, half up, like [GPUMs].
func MilliJoules(uj int64) int64 {
	if uj <= 0 {
		return 0
	}
	return (uj + 500) / 1000
}
