package fleet

import (
	"math"
	"sync/atomic"

	"github.com/sluicehq/sluice/vllm"
)

// latency is a replica's mean service time as the replica itself reports
// it: vllm:e2e_request_latency_seconds over the completions between two
// scrapes, whoever sent them. The gate's forecast multiplies a tenant's
// arrival rate by a service time; an instance that has completed nothing
// on a pool yet (it has just started, or its only tenant has just begun
// to flood beside other instances' tenants) knows none of its own, and
// would forecast a flood at nothing for its first service time.
type latency struct {
	// sum and count are the histogram's _sum and _count at the last
	// scrape that had both; only the centre's Observe goroutine touches
	// them (as Replica.PolledAt).
	sum, count float64
	seen       bool
	// mean is the mean in seconds (float64 bits), about the last ten
	// completions; 0: none seen.
	mean atomic.Uint64
}

// NoteLatency folds one scrape's vllm:e2e_request_latency_seconds _sum and
// _count into the replica's mean service time. A scrape without them
// (an engine that does not export the histogram) changes nothing; one
// taken after a restart (restarted, or counts that went down) starts a
// new baseline.
func (r *Replica) NoteLatency(sum, count vllm.Value, restarted bool) {
	l := &r.latency
	if !sum.OK || !count.OK {
		return
	}
	dn, ds := count.V-l.count, sum.V-l.sum
	fresh := !l.seen || restarted
	l.sum, l.count, l.seen = sum.V, count.V, true
	old := math.Float64frombits(l.mean.Load())
	switch {
	case fresh && old == 0 && count.V > 0 && sum.V >= 0:
		// The replica's lifetime mean, until completions since say more:
		// an instance that starts beside a busy replica knows a service
		// time from its first scrape.
		l.mean.Store(math.Float64bits(sum.V / count.V))
	case fresh || dn <= 0 || ds < 0:
		// A baseline only, or nothing completed since.
	default:
		mean := ds / dn
		if old > 0 {
			mean = old + (1-math.Pow(0.9, dn))*(mean-old) // about the last ten, as the gate's own
		}
		l.mean.Store(math.Float64bits(mean))
	}
}

// ServiceTime is the replica's mean service time in seconds from its own
// latency histogram (NoteLatency); 0 while unknown.
func (r *Replica) ServiceTime() float64 { return math.Float64frombits(r.latency.mean.Load()) }
