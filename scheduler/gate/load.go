package gate

import "math"

// TenantLoad is one tenant's load on a pool as the gate sees it.
type TenantLoad struct {
	Name   string
	Weight float64
	Held   int64 // requests in flight or being dispatched
	Queued int64 // requests queued
	Tokens int64 // in-flight tokens (input + allowed output)
	// Cumulative: requests that arrived, requests that ran and their
	// service seconds (dispatch to settlement), for the forecast.
	Arrived, Served int64
	ServedSec       float64
}

// FleetLoad is the summed room of a pool's replicas that take work.
type FleetLoad struct {
	Seqs, SeqsCap     int64
	Tokens, TokensCap int64
	// Probe: sequences of SeqsCap that are an unconfirmed probe of a
	// learned batch (fleet.Replica.ProbeExcess).
	Probe int64
	// PeerWeight is the summed weight of the tenants with demand on the
	// pool's replicas that only other instances report (fleet.Replica.PeerWeight).
	PeerWeight float64
	// Svc is the mean service time in seconds of the pool's replicas'
	// completions as they report them (vLLM's e2e latency histogram,
	// fleet.Replica.ServiceTime), whoever sent them; 0 unknown. The gate
	// uses it until it has seen completions of its own on the pool.
	Svc float64
}

// FitsBeyond reports whether one more request of size tokens fits the fleet
// with the fraction reserve of its sequences and tokens kept free, within
// the confirmed batches: sequences that only probe a learned batch upwards
// are kept free too while anything is reserved, so that the reserve is
// room the replicas really run.
func (f FleetLoad) FitsBeyond(size int64, reserve float64) bool {
	if reserve <= 0 {
		return true // the replica choice (take) decides
	}
	keepSeqs := int64(math.Ceil(reserve*float64(f.SeqsCap)-1e-9)) + f.Probe
	keepTokens := int64(math.Ceil(reserve*float64(f.TokensCap) - 1e-9))
	return f.Seqs+1+keepSeqs <= f.SeqsCap && f.Tokens+size+keepTokens <= f.TokensCap
}
