//go:build race

package fleet_test

// raceEnabled shortens the seeded sweep under the race detector, which
// slows these single-goroutine runs tenfold and has nothing to find in
// them beyond the first few shapes.
const raceEnabled = true
