package gpu

import (
	"math/bits"
	"sync"
	"testing"
	"time"
)

// clockV1 is a virtual GPU clock (V advances at u·g/n, u held from the
// last sample), kept only as the benchmark baseline for the interval
// attribution: its conservation is wrong, but its cost per request is the
// bar.
type clockV1 struct {
	gpus uint64
	mu   sync.Mutex
	last time.Time
	u    uint64
	n    int64
	v    uint64
	res  uint64
}

func (c *clockV1) advanceLocked(now time.Time) {
	dt := now.Sub(c.last)
	if dt <= 0 {
		return
	}
	c.last = now
	n := uint64(max(c.n, 0))
	if c.u == 0 || n == 0 {
		return
	}
	hi, lo := bits.Mul64(c.u*c.gpus, uint64(dt))
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

func (c *clockV1) start(now time.Time) uint64 {
	c.mu.Lock()
	c.advanceLocked(now)
	c.n++
	v := c.v
	c.mu.Unlock()
	return v
}

func (c *clockV1) end(now time.Time, v0 uint64) int64 {
	c.mu.Lock()
	c.advanceLocked(now)
	c.n--
	d := c.v - v0
	c.mu.Unlock()
	return int64(d)
}

const ppm = 1_000_000

// BenchmarkClockV1Attribution is BenchmarkClockAttribution on clockV1, for
// a side-by-side ratio.
func BenchmarkClockV1Attribution(b *testing.B) {
	c := &clockV1{gpus: 8, last: c0, u: 700_000}
	bg := c.start(c0)
	now := c0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		v := c.start(now)
		now = now.Add(time.Microsecond)
		_ = c.end(now, v)
	}
	_ = c.end(now, bg)
}
