// Package ledgertest is the one conformance suite every ledger backend
// passes (LEDGER.md §7). A backend's test calls [Run] with a [Factory]:
//
//	func TestConformance(t *testing.T) {
//		ledgertest.Run(t, func(t *testing.T, cfg ledgertest.Config) *ledgertest.Backend { ... })
//	}
//
// The suite covers the tests that make sense for every backend: T2, T3, T5,
// T6, T7, T11 (with a Corrupt hook), T12, T13, T16 (model-based, against a
// plain-map reference model) and T19. Tests that need a hook the backend
// lacks call t.Skip.
//
// # Time
//
// The suite reads ledger time with Backend.Now and moves it only with
// Backend.Advance; between Advance calls ledger time must not move (Memory:
// an injected clock; Redis: keep every tenant's hwm ahead of TIME and raise
// it). Tests assert exact lease expiries and window indices.
package ledgertest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Config is what the suite asks of a fresh backend.
type Config struct {
	// LeaseTTL is the default lease (ReserveRequest.LeaseTTL == 0).
	LeaseTTL time.Duration
	// MaxLeaseTTL bounds Reserve and Extend TTLs.
	MaxLeaseTTL time.Duration
	// TombstoneRetention keeps terminal records.
	TombstoneRetention time.Duration
	// Durable asks for a backend that survives Restart (Memory: a journal in
	// t.TempDir()). Factories that cannot provide one leave Backend.Restart nil.
	Durable bool
}

// Corruption names a kind of stored-state damage for Backend.Corrupt (T11).
type Corruption int

// Kinds of corruption.
const (
	NegativeReserved   Corruption = iota + 1 // r of the scope's tokens goes negative
	UnknownState                             // the record's state becomes unknown
	LeaseWithoutRecord                       // the lease index names a record that does not exist
)

// Backend is one fresh backend under test plus its test hooks.
type Backend struct {
	// Ledger is the backend. Required.
	Ledger ledger.Ledger
	// Now returns the current ledger time. Required.
	Now func() time.Time
	// Advance moves ledger time forward by d for every tenant. Required.
	Advance func(d time.Duration)
	// Audit recomputes invariant I5 for one tenant and returns an error on
	// drift. Optional; nil skips audit assertions.
	Audit func(tenant ledger.ScopeKey) error
	// Dump returns everything stored for a tenant as comparable text (Redis:
	// DUMP of every key), to prove refused calls wrote nothing. Optional.
	Dump func(tenant ledger.ScopeKey) string
	// Restart simulates a crash and restart of the front end that owns every
	// in-flight request, returning the ledger to use afterwards: RESERVED
	// records become EXPIRED and DISPATCHED ones UNRESOLVED. Optional (only
	// when Config.Durable was honoured).
	Restart func() (ledger.Ledger, error)
	// Corrupt damages the tenant's stored state; ref names a record (for
	// UnknownState and LeaseWithoutRecord) and scope a scope (for
	// NegativeReserved). Optional.
	Corrupt func(kind Corruption, ref ledger.Ref, scope ledger.ScopeKey) error
	// Orphans returns how many Settles found no record so far. Optional.
	Orphans func() int
	// Peers are more front ends on the same store (Redis: another Ledger
	// with its own client and pool), used by the concurrency tests of global
	// budgets. Optional.
	Peers []ledger.Ledger
	// AtomicGlobal says global admission is atomic with the other scopes
	// (Memory), so the suite demands zero false global denials even when
	// other budgets deny; otherwise (Redis' two steps) it only reports them.
	AtomicGlobal bool
	// ModelSequences is how many T16 sequences to run. Optional; default 10,000.
	ModelSequences int
}

// Factory returns a fresh backend configured as cfg asks. It registers its
// own cleanup with t.Cleanup.
type Factory func(t *testing.T, cfg Config) *Backend

// DefaultConfig is the configuration most tests use.
func DefaultConfig() Config {
	return Config{LeaseTTL: 60 * time.Second, MaxLeaseTTL: 120 * time.Second, TombstoneRetention: time.Hour}
}

// Run runs the whole conformance suite against backends from f.
func Run(t *testing.T, f Factory) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory)
	}{
		{"T2_HeterogeneousAmounts", testHeterogeneous},
		{"T3_DuplicateReserve", testDuplicateReserve},
		{"T5_DuplicateSettle", testDuplicateSettle},
		{"T6_SettleRacingExpiry", testSettleRacingExpiry},
		{"T7_SettleAfterTTL", testSettleAfterTTL},
		{"T11_CorruptState", testCorrupt},
		{"T12_MalformedPolicy", testMalformedPolicy},
		{"PolicyVersionUnordered", testPolicyVersionUnordered},
		{"SameAttempt", testSameAttempt},
		{"GPUJoules", testGPUJoules},
		{"T13_WindowRollover", testWindowRollover},
		{"T16_ModelBased", testModel},
		{"T16_ModelBasedWithRestart", testModelRestart},
		{"T19_LeakRegressions", testLeaks},
		{"StateMachine", testStateMachine},
		{"List", testList},
		{"Global", testGlobal},
		{"Charge", testCharge},
		{"ExtensionsRestart", testExtensionsRestart},
		{"Grow", testGrow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f) })
	}
}

// ---- shared helpers ----

var seqCounter atomic.Uint64

// newKey returns a fresh, non-zero ScopeKey unique within the process.
func newKey(tag byte) ledger.ScopeKey {
	n := seqCounter.Add(1)
	var k ledger.ScopeKey
	k[0] = tag
	k[1] = 0xA5
	for i := 0; i < 8; i++ {
		k[8+i] = byte(n >> (8 * i))
	}
	id := ledger.NewRequestID()
	copy(k[2:8], id[:6])
	return k
}

func tokens(in, out int64) ledger.Amounts {
	return ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: in, ledger.OutputTokens: out, ledger.Tokens: in + out}
}

func tenantScope(key ledger.ScopeKey, limits ...ledger.Limit) ledger.Scope {
	return ledger.Scope{Kind: ledger.KindTenant, Key: key, Limits: limits}
}

func lim(d ledger.Dim, w time.Duration, limit int64) ledger.Limit {
	return ledger.Limit{Dim: d, Window: w, Max: limit}
}

func slots(limit int64) ledger.Limit { return ledger.Limit{Dim: ledger.Slots, Max: limit} }

// usage snapshots a scope or fails the test.
func usage(t *testing.T, b *Backend, tenant, scope ledger.ScopeKey) ledger.Usage {
	t.Helper()
	u, err := b.Ledger.Snapshot(t.Context(), tenant, scope)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return u
}

func committed(u ledger.Usage, d ledger.Dim, w time.Duration) int64 {
	for _, l := range u.Limits {
		if l.Limit.Dim == d && l.Limit.Window == w {
			return l.Committed
		}
	}
	return 0
}

func auditClean(t *testing.T, b *Backend, tenant ledger.ScopeKey) {
	t.Helper()
	if b.Audit == nil {
		return
	}
	if err := b.Audit(tenant); err != nil {
		t.Fatalf("audit not clean: %v", err)
	}
}

func isDenied(err error) (*ledger.DeniedError, bool) {
	var d *ledger.DeniedError
	ok := errors.As(err, &d)
	return d, ok
}

func describe(err error) string {
	if err == nil {
		return "nil"
	}
	var fe *ledger.FinalError
	if errors.As(err, &fe) {
		return "final(" + fe.State.String() + ")"
	}
	if d, ok := isDenied(err); ok {
		return fmt.Sprintf("denied{%s %s %s limit=%d c=%d r=%d h=%d resets=%d retry=%s}", d.Scope, d.Dim,
			ledger.FormatWindow(d.Window), d.Limit, d.Committed, d.Reserved, d.Requested, ms(d.ResetsAt), d.RetryAfter)
	}
	for _, s := range []error{ledger.ErrInvalid, ledger.ErrPolicy, ledger.ErrConflict, ledger.ErrAlreadyFinal,
		ledger.ErrNotFound, ledger.ErrDispatched, ledger.ErrLeaseLost, ledger.ErrUnavailable, ledger.ErrAmbiguous,
		ledger.ErrRecovering, ledger.ErrCorrupt} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "unclassified: " + err.Error()
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
