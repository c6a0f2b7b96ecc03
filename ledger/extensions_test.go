package ledger_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// TestMemoryUsageEventsOfExtensions: a Charge emits one usage event (source
// outage, admitted at At) and a replay none; a Settle of a request with a
// global scope names the global scope in its event.
func TestMemoryUsageEventsOfExtensions(t *testing.T) {
	var mu sync.Mutex
	var evs []ledger.UsageEvent
	now := jT0.Add(30 * time.Minute)
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return now }, Logger: quiet,
		OnUsage: func(ev ledger.UsageEvent) { mu.Lock(); evs = append(evs, ev); mu.Unlock() }})
	require.NoError(t, err)
	ctx := t.Context()
	limits := []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}
	g := ledger.ScopeKey{0x7e, 4}
	a := ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 3, ledger.OutputTokens: 2, ledger.Tokens: 5}
	c := ledger.ChargeRequest{Ref: ledger.Ref{Tenant: jTenant, ID: jID(1)}, Amounts: a, At: jT0.Add(10 * time.Minute),
		Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: jTenant, Limits: limits}, {Kind: ledger.KindGlobal, Key: g, Limits: limits}}}
	_, err = m.Charge(ctx, c)
	require.NoError(t, err)
	s, err := m.Charge(ctx, c)
	require.NoError(t, err)
	require.True(t, s.Replayed)
	req := jReq(2)
	req.Scopes = append(req.Scopes, ledger.Scope{Kind: ledger.KindGlobal, Key: g, Limits: limits})
	_, err = m.Reserve(ctx, req)
	require.NoError(t, err)
	_, err = m.Settle(ctx, req.Ref, a, ledger.SourceFinal)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	assert.Equal(t, ledger.UsageEvent{Ref: c.Ref, NScopes: 2, Scopes: [ledger.MaxScopes]ledger.ScopeRef{
		{Kind: ledger.KindTenant, Key: jTenant}, {Kind: ledger.KindGlobal, Key: g}}, Actual: a, Charged: a,
		Source: ledger.SourceOutage, State: ledger.Settled, AdmittedAt: c.At, At: now}, evs[0])
	assert.Equal(t, len(jReq(2).Scopes)+1, evs[1].NScopes, "the settle event names the global scope too")
	assert.Equal(t, ledger.ScopeRef{Kind: ledger.KindGlobal, Key: g}, evs[1].Scopes[evs[1].NScopes-1])
	require.NoError(t, m.Audit())
}

// TestMemoryGlobalLockOrder: many tenants hammering one global scope with
// every operation, plus Reclaim, Snapshot, Audit and Compact, under -race.
// Any lock-order inversion deadlocks (the test times out) and any
// unguarded access is a race report.
func TestMemoryGlobalLockOrder(t *testing.T) {
	clock := struct {
		sync.Mutex
		t time.Time
	}{t: jT0}
	m, err := ledger.NewMemory(ledger.MemoryConfig{Logger: quiet, Journal: t.TempDir() + "/j", Fsync: ledger.Group(time.Millisecond),
		Clock: func() time.Time {
			clock.Lock()
			defer clock.Unlock()
			clock.t = clock.t.Add(time.Millisecond)
			return clock.t
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	ctx := t.Context()
	g := ledger.ScopeKey{0x7e, 4}
	glim := []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40}}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			tenant := ledger.ScopeKey{0x7d, byte(w)}
			for i := range 150 {
				req := ledger.ReserveRequest{Ref: ledger.Ref{Tenant: tenant, ID: ledger.NewRequestID()}, Owner: jOwner,
					Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: tenant, Limits: glim}, {Kind: ledger.KindGlobal, Key: g, Limits: glim}},
					Held:   ledger.Amounts{ledger.Tokens: 3, ledger.InputTokens: 3}, LeaseTTL: 5 * time.Millisecond}
				if _, err := m.Reserve(ctx, req); err != nil {
					t.Error(err)
					return
				}
				switch i % 4 {
				case 0:
					_ = m.MarkDispatched(ctx, req.Ref, req.Owner)
					_, _ = m.Settle(ctx, req.Ref, req.Held, ledger.SourceFinal)
				case 1:
					_ = m.Release(ctx, req.Ref, req.Owner)
				case 2:
					_ = m.MarkDispatched(ctx, req.Ref, req.Owner) // left to Reclaim: UNRESOLVED
				}
				_, _ = m.Reclaim(ctx, tenant, 16)
				_, _ = m.Snapshot(ctx, g, g)
				if i%50 == 0 {
					_ = m.Audit()
					_ = m.Compact(ctx)
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, m.Audit())
}
