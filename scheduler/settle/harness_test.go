package settle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// The room's tests run it on a real ledger.Memory whose calls a test may
// intercept one operation at a time, as the scheduler's do.

var _ Charger = (*ledger.Memory)(nil)

// hookLedger delegates to a Memory unless a hook answers an error.
type hookLedger struct {
	*ledger.Memory
	mu     sync.Mutex
	calls  map[string]int
	settle func(ref ledger.Ref) error // non-nil: answered instead
	extend func(ref ledger.Ref) error
}

func newHookLedger(t testing.TB) *hookLedger {
	t.Helper()
	m, err := ledger.NewMemory(ledger.MemoryConfig{LeaseTTL: 60 * time.Second})
	require.NoError(t, err)
	return &hookLedger{Memory: m, calls: map[string]int{}}
}

// set runs fn under the fake's lock (hooks are read under it too).
func (l *hookLedger) set(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn()
}

func (l *hookLedger) n(op string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[op]
}

func (l *hookLedger) count(op string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[op]++
}

func (l *hookLedger) Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error) {
	l.count("settle")
	l.mu.Lock()
	h := l.settle
	l.mu.Unlock()
	if h != nil {
		if err := h(ref); err != nil {
			return ledger.Settlement{}, err
		}
	}
	return l.Memory.Settle(ctx, ref, actual, src)
}

func (l *hookLedger) Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error) {
	l.count("extend")
	l.mu.Lock()
	h := l.extend
	l.mu.Unlock()
	if h != nil {
		if err := h(ref); err != nil {
			return time.Time{}, err
		}
	}
	return l.Memory.Extend(ctx, ref, owner, ttl)
}

func (l *hookLedger) Charge(ctx context.Context, req ledger.ChargeRequest) (ledger.Settlement, error) {
	l.count("charge")
	return l.Memory.Charge(ctx, req)
}

// acme is the tenant the tests hold for: hourly tokens and requests.
var (
	acme       = ledger.ScopeKey{1, 2, 3}
	acmeLimits = []ledger.Limit{
		{Dim: ledger.Tokens, Window: time.Hour, Max: 1_000_000},
		{Dim: ledger.Requests, Window: time.Hour, Max: 1000},
	}
	acmeScopes = []ledger.Scope{{Kind: ledger.KindTenant, Key: acme, Limits: acmeLimits}}
)

// testPaths is a pending-writes log, and the older files, in a fresh
// directory.
func testPaths(t testing.TB) config.StatePaths {
	dir := t.TempDir()
	return config.StatePaths{Dir: dir, Pending: filepath.Join(dir, config.PendingName),
		LegacyOutbox: filepath.Join(dir, config.OutboxName), LegacyOutage: filepath.Join(dir, config.OutageName)}
}

// newRoom opens a room on led with the log at paths (a process start).
func newRoom(t testing.TB, led Ledger, paths config.StatePaths, writeAhead bool) *Settler {
	t.Helper()
	s, err := New(Deps{Ledger: led, Owner: ledger.NewOwner(), LeaseTTL: func() time.Duration { return time.Minute }}, paths, writeAhead)
	require.NoError(t, err)
	return s
}

// reserve holds 100 tokens and a request on acme for owner.
func reserve(t testing.TB, led Ledger, owner ledger.Owner) ledger.Ref {
	t.Helper()
	ref := ledger.Ref{Tenant: acme, ID: ledger.NewRequestID()}
	_, err := led.Reserve(context.Background(), ledger.ReserveRequest{Ref: ref, Owner: owner, Scopes: acmeScopes,
		Held: ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 90, ledger.OutputTokens: 10, ledger.Tokens: 100}})
	require.NoError(t, err)
	return ref
}

// used is what a call reported: 5 tokens in, 3 out.
var used = ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 5, ledger.OutputTokens: 3, ledger.Tokens: 8}

// settleCall ends ref as the scheduler's settlement of a call does:
// written ahead, sent, then landed or handed to the log.
func settleCall(t testing.TB, s *Settler, ref ledger.Ref, actual ledger.Amounts) {
	t.Helper()
	s.WriteAhead(ref, actual, ledger.SourceFinal, "req")
	_, err := s.led.Settle(context.Background(), ref, actual, ledger.SourceFinal)
	if ledger.IsStoreError(err) {
		s.QueueSettle(ref, actual, ledger.SourceFinal, "req")
		return
	}
	require.NoError(t, err)
	s.Landed(ref.ID)
}

// acmeUsage is acme's ledger counters.
func acmeUsage(t testing.TB, m *ledger.Memory) ledger.Usage {
	t.Helper()
	u, err := m.Snapshot(context.Background(), acme, acme)
	require.NoError(t, err)
	return u
}

// committed is the committed amount of dim in acme's hourly limit of it.
func committed(u ledger.Usage, d ledger.Dim) int64 {
	for _, l := range u.Limits {
		if l.Limit.Dim == d && l.Limit.Window == time.Hour {
			return l.Committed
		}
	}
	return -1
}

// lines counts a file's lines.
func lines(t testing.TB, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return bytes.Count(b, []byte("\n"))
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}
