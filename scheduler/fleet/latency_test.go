package fleet

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/vllm"
)

// TestNoteLatency: a replica's service time is the mean of what its
// latency histogram gained between two scrapes, about the last ten
// completions; the first scrape gives the replica's lifetime mean until
// then, a first after a restart is only a baseline, and a scrape without
// the histogram or without completions changes nothing.
func TestNoteLatency(t *testing.T) {
	t.Parallel()
	ok := func(x float64) vllm.Value { return vllm.Value{V: x, OK: true} }
	r := &Replica{Name: "r"}
	r.NoteLatency(ok(0), ok(0), false)
	assert.Zero(t, r.ServiceTime(), "nothing completed yet")
	r.NoteLatency(ok(500), ok(100), false)
	assert.InDelta(t, 5.0, r.ServiceTime(), 1e-9, "500 s over 100 completions")

	r = &Replica{Name: "r"}
	r.NoteLatency(ok(500), ok(100), false)
	assert.InDelta(t, 5.0, r.ServiceTime(), 1e-9, "the first scrape: its lifetime mean")
	r.NoteLatency(ok(520), ok(110), false)
	assert.InDelta(t, 5.0+(1-math.Pow(0.9, 10))*(2.0-5.0), r.ServiceTime(), 1e-9, "20 s over 10 completions: about the last ten")

	r = &Replica{Name: "r"}
	r.NoteLatency(ok(0), ok(0), false)
	r.NoteLatency(ok(20), ok(10), false)
	assert.InDelta(t, 2.0, r.ServiceTime(), 1e-9, "the first mean whole")

	r.NoteLatency(vllm.Value{}, vllm.Value{}, false)
	r.NoteLatency(ok(20), ok(10), false)
	assert.InDelta(t, 2.0, r.ServiceTime(), 1e-9, "no histogram, no completions: unchanged")

	r.NoteLatency(ok(24), ok(11), false)
	assert.InDelta(t, 2.0+0.1*(4.0-2.0), r.ServiceTime(), 1e-9, "one completion moves it a tenth of the way")

	r.NoteLatency(ok(3), ok(2), false)
	assert.InDelta(t, 2.2, r.ServiceTime(), 1e-9, "counts went down: a restart, a new baseline")
	r.NoteLatency(ok(7), ok(3), false)
	assert.InDelta(t, 2.2+0.1*(4.0-2.2), r.ServiceTime(), 1e-9, "from the new baseline")

	r.NoteLatency(ok(90), ok(4), true)
	assert.InDelta(t, 2.38, r.ServiceTime(), 1e-9, "a restart the poller saw: a baseline, not a sample")
}

// TestFleetOfServiceTime: the pool's service time is the mean over its
// replicas that report one; one that reports none does not pull it to 0.
func TestFleetOfServiceTime(t *testing.T) {
	t.Parallel()
	ok := func(x float64) vllm.Value { return vllm.Value{V: x, OK: true} }
	a, b, c := &Replica{Name: "a", MaxSeqs: 8}, &Replica{Name: "b", MaxSeqs: 8}, &Replica{Name: "c", MaxSeqs: 8}
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000, "c": 1000}), a, b, c)
	var all PoolKey
	for i := range 3 {
		all.Set(i)
	}
	assert.Zero(t, set.FleetOf(all, false, 0).Svc, "none known")
	for _, r := range []*Replica{a, b} {
		r.NoteLatency(ok(0), ok(0), false)
	}
	a.NoteLatency(ok(10), ok(5), false)
	b.NoteLatency(ok(40), ok(10), false)
	assert.InDelta(t, 3.0, set.FleetOf(all, false, 0).Svc, 1e-9, "a's 2 s and b's 4 s; c unknown")
}
