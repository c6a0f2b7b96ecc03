// Package abuse decides when to clamp a tenant automatically: per tenant,
// detectors over a short window compare its traffic with its own recent
// baseline and with fixed thresholds, and the first to fire yields a
// [Decision] — the same clamp the admin API applies, with a reason carrying
// the numbers and an expiry.
//
// The package is pure: no I/O, no goroutines, an injected clock. The server
// feeds a [Detector] with one cheap [Detector.Observe] call per admission,
// budget denial and finished request, and on a decision applies the clamp
// (Source "auto"), writes the audit line and counts the metric. It tells
// the detector about clamps it did not decide ([Detector.Clamped]) and
// about operator lifts ([Detector.Lifted]).
//
// # Detectors
//
// Over the last Config.Window (a sliding window of one-second buckets):
//
//   - spend_rate: tokens/s or usd_micros/s > spend_rate_factor × reference
//   - gpu_ms_rate: GPU-ms/s > gpu_ms_rate_factor × reference
//   - max_cap_burst: admissions at the output cap >= count, and their share
//     of admissions >= share
//   - disconnect_share: finished requests >= min_count, and the share that
//     were client disconnects >= share
//   - denials: budget denials >= denials
//
// The reference of a rate detector is the larger of the tenant's baseline
// rate and Config.MinRate. The baseline is the mean rate over the
// Config.Baseline before the detector window (whole windows, left out:
// the first partial window, windows overlapping a firing window, windows
// under a clamp). A tenant has no baseline until it has been seen for one
// full baseline and at least half of it is usable; until then the floor
// alone is the reference, and with no floor it is not rate-checked. When
// clamps leave too little of the baseline usable, the baseline measured at
// the last decision stands in until an operator lifts the clamp
// ([Detector.Lifted]).
//
// # Detection time
//
// With factor F and a tenant jumping from its baseline to M× it, the
// window's mean passes F× baseline after W·(F−1)/(M−1) of the new rate:
// within the window W whenever M > F (20× against F = 10
// is caught after 0.47·W, 14s of a 30s window). Rates are "above" (>);
// counts and shares are "at least" (>=).
//
// # Invariants
//
//   - At most one decision per tenant until the clamp it asked for expires,
//     or until Config.Cooldown after an operator lifts it.
//   - Memory per tenant is fixed by its Config (two rings); Observe is O(1)
//     amortised and allocation-free for a tenant already seen.
//   - A decision never concerns requests already admitted: applying it is
//     the caller's, from the next admission or dispatch.
package abuse
