package gpu

// State is a replica's health state (SCHEDULING §7). Larger is worse.
type State uint8

// Health states, ordered from best to worst.
const (
	// StateHealthy has capacity factor 1.
	StateHealthy State = iota
	// StateDegraded has capacity factor [Config.DegradedFactor].
	StateDegraded
	// StateDraining gets nothing new; its in-flight requests finish.
	StateDraining
	// StateDown gets nothing.
	StateDown
)

// String returns the lower-case name used in logs, metrics docs and the CLI.
func (s State) String() string {
	switch s {
	case StateHealthy:
		return "healthy"
	case StateDegraded:
		return "degraded"
	case StateDraining:
		return "draining"
	case StateDown:
		return "down"
	}
	return "unknown"
}

// immediate reports whether entering s skips the enter hysteresis: fatal
// GPU errors, operator drains and repeated scrape failures act at once
// (the failure count is its own hysteresis).
func (s State) immediate() bool { return s >= StateDraining }
