package scheduler

import (
	"math"
	"slices"
	"sync"
	"time"
)

// The dispatch gate's discrete-event tests are in scheduler/gate
// (des_test.go); fairgen_test.go runs the same kind of simulation with
// the real learned batch and shares these helpers.

type desClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *desClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *desClock) set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
}
