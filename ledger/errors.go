package ledger

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Every error a backend returns either is, or wraps, one of
// these or is a [*DeniedError]; callers classify with [errors.Is] / [errors.As].
var (
	// ErrInvalid: a malformed call (amount out of range, tokens != input+output,
	// missing tenant scope, bad lease TTL). Nothing was written.
	ErrInvalid = errors.New("ledger: invalid request")
	// ErrPolicy: a malformed policy (bad limit, bad window, scope without
	// limits, PolicyVersion above MaxCounter). Nothing was written.
	ErrPolicy = errors.New("ledger: invalid policy")
	// ErrConflict: the request id exists with a different payload (Reserve) or a
	// different actual (Settle). Nothing was written.
	ErrConflict = errors.New("ledger: conflicting replay")
	// ErrAlreadyFinal: the request id is terminal (or a tombstone).
	ErrAlreadyFinal = errors.New("ledger: request already final")
	// ErrNotFound: no record with this id (never reserved, or its tombstone aged out).
	ErrNotFound = errors.New("ledger: request not found")
	// ErrDispatched: Release after dispatch; settle it instead (Settle(zero, SourceNotSent)).
	ErrDispatched = errors.New("ledger: request already dispatched")
	// ErrLeaseLost: the lease expired, the record is UNRESOLVED, or another owner holds it.
	// The caller must stop (abort upstream) — see invariant I10.
	ErrLeaseLost = errors.New("ledger: lease lost")
	// ErrUnavailable: the store could not be reached; the operation was not applied.
	ErrUnavailable = errors.New("ledger: store unavailable")
	// ErrAmbiguous: the outcome is unknown (timeout after sending); replay by id.
	ErrAmbiguous = errors.New("ledger: outcome unknown")
	// ErrRecovering: the store lost state and is fencing old leases; retry later.
	ErrRecovering = errors.New("ledger: store recovering")
	// ErrCorrupt: stored state violates an invariant (negative counter, unknown
	// state, bad journal). Nothing was written; alert.
	ErrCorrupt = errors.New("ledger: corrupt state")
	// ErrDenied matches every [*DeniedError] via errors.Is, for callers that only
	// need the class.
	ErrDenied = errors.New("ledger: budget denied")
)

// FinalError is what Reserve returns for an id whose record is terminal (or
// a tombstone): errors.Is(err, ErrAlreadyFinal) holds, and State says how
// it ended, so a caller can tell a first attempt that never ran (RELEASED,
// EXPIRED) from one that was charged (SETTLED, CHARGED, SETTLED_LATE).
type FinalError struct {
	State State
}

// Error implements error.
func (e *FinalError) Error() string {
	return "ledger: request already final (" + e.State.String() + ")"
}

// Is makes errors.Is(err, ErrAlreadyFinal) true.
func (e *FinalError) Is(target error) bool { return target == ErrAlreadyFinal }

// DeniedError reports the block-mode limit that refused a Reserve (or the slot
// limit that refused a dispatch). When several limits fail, it names the
// budget limit that resets last; budget limits outrank slots. Times are ledger
// time. It carries everything the 429 details object and Retry-After need, and
// never an id or hash.
type DeniedError struct {
	Scope     Kind          // kind of the failing scope (tenant, api_key, workflow)
	Dim       Dim           // failing dimension
	Window    time.Duration // 0 for slots
	Limit     int64         // the limit's max
	Committed int64         // c in the current window (slots: 0)
	Reserved  int64         // r in flight (slots: n in use)
	Requested int64         // h of this request (slots: 1)
	ResetsAt  time.Time     // end of the current window; zero for slots
	// RetryAfter is ResetsAt − now (0 for slots, which free on completion).
	RetryAfter time.Duration
}

// Error implements error. It names the scope kind, never an id.
func (e *DeniedError) Error() string {
	var b strings.Builder
	if e.Dim == Slots {
		fmt.Fprintf(&b, "ledger: %s concurrency limit reached: %d of %d slots in use", e.Scope, e.Reserved, e.Limit)
		return b.String()
	}
	fmt.Fprintf(&b, "ledger: %s budget exceeded: %s per %s: committed %d + reserved %d + requested %d > limit %d; resets at %s (retry after %s)",
		e.Scope, e.Dim, FormatWindow(e.Window), e.Committed, e.Reserved, e.Requested, e.Limit,
		e.ResetsAt.UTC().Format(time.RFC3339), e.RetryAfter)
	return b.String()
}

// Is makes errors.Is(err, ErrDenied) true for every *DeniedError.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// FormatWindow renders a window the way the 429 details object does: "1h",
// "24h", "720h", "30m", "90s"; "0" for slots.
func FormatWindow(w time.Duration) string {
	switch {
	case w <= 0:
		return "0"
	case w%time.Hour == 0:
		return fmt.Sprintf("%dh", w/time.Hour)
	case w%time.Minute == 0:
		return fmt.Sprintf("%dm", w/time.Minute)
	default:
		return fmt.Sprintf("%ds", w/time.Second)
	}
}

// DeniedDetails is the `details` object of a 429 (LEDGER.md §4). It names the
// scope kind, never an id or hash.
type DeniedDetails struct {
	Scope     string `json:"scope"`
	Dimension string `json:"dimension"`
	Window    string `json:"window"`
	Limit     int64  `json:"limit"`
	Committed int64  `json:"committed"`
	Reserved  int64  `json:"reserved"`
	Requested int64  `json:"requested"`
	ResetsAt  string `json:"resets_at,omitempty"` // RFC 3339 UTC; empty for slots
}

// Details returns the 429 details object for e.
func (e *DeniedError) Details() DeniedDetails {
	d := DeniedDetails{Scope: e.Scope.String(), Dimension: e.Dim.String(), Window: FormatWindow(e.Window),
		Limit: e.Limit, Committed: e.Committed, Reserved: e.Reserved, Requested: e.Requested}
	if !e.ResetsAt.IsZero() {
		d.ResetsAt = e.ResetsAt.UTC().Format(time.RFC3339)
	}
	return d
}

// RetryAfterMillis returns RetryAfter rounded up to whole milliseconds (for
// retry-after-ms); Retry-After is this divided by 1000, rounded up.
func (e *DeniedError) RetryAfterMillis() int64 {
	return int64((e.RetryAfter + time.Millisecond - 1) / time.Millisecond)
}
