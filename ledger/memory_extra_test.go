package ledger_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

func TestMemoryRunReclaims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := ledger.NewMemory(ledger.MemoryConfig{LeaseTTL: 2 * time.Second, ReclaimInterval: time.Second, Logger: quiet})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		reserved := jReq(1) // odd: RESERVED
		dispatched := jReq(2)
		for _, r := range []ledger.ReserveRequest{reserved, dispatched} {
			_, err := m.Reserve(ctx, r)
			require.NoError(t, err)
		}
		time.Sleep(1500 * time.Millisecond) // fake time: one tick, leases not due
		synctest.Wait()
		u, err := m.Snapshot(ctx, jTenant, jTenant)
		require.NoError(t, err)
		assert.Equal(t, int64(2+3), u.Reserved[ledger.Tokens], "never early")
		time.Sleep(time.Second) // second tick at 2 s: both due
		synctest.Wait()
		u, err = m.Snapshot(ctx, jTenant, jTenant)
		require.NoError(t, err)
		assert.Equal(t, int64(3), u.Reserved[ledger.Tokens], "RESERVED expired, DISPATCHED holds kept")
		assert.Equal(t, int64(0), u.SlotsInUse)
		assert.Equal(t, 1, u.Unresolved)
		cancel()
		assert.NoError(t, <-done)
		require.NoError(t, m.Audit())
	})
}

func TestMemoryUsageEventsAndAlerts(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: jT0}
	var mu sync.Mutex
	var events []ledger.UsageEvent
	var alerts []ledger.Alert
	reg := prometheus.NewRegistry()
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: clock.Now, Logger: quiet, Registerer: reg,
		OnUsage: func(e ledger.UsageEvent) { mu.Lock(); events = append(events, e); mu.Unlock() },
		OnAlert: func(a ledger.Alert) { mu.Lock(); alerts = append(alerts, a); mu.Unlock() },
	})
	require.NoError(t, err)
	ctx := t.Context()
	a := jReq(0)
	_, err = m.Reserve(ctx, a)
	require.NoError(t, err)
	actual := ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 1, ledger.Tokens: 1}
	_, err = m.Settle(ctx, a.Ref, actual, ledger.SourceFinal)
	require.NoError(t, err)
	_, err = m.Settle(ctx, a.Ref, actual, ledger.SourceFinal) // replay: no second event
	require.NoError(t, err)
	b := jReq(2)
	b.LeaseTTL = time.Second
	_, err = m.Reserve(ctx, b)
	require.NoError(t, err)
	clock.Advance(time.Second)
	_, err = m.Reclaim(ctx, jTenant, 10)
	require.NoError(t, err)
	_, err = m.Resolve(ctx, b.Ref)
	require.NoError(t, err)
	_, err = m.Settle(ctx, b.Ref, actual, ledger.SourcePartial) // after CHARGED: logged, not charged
	require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
	c := jReq(3)
	_, err = m.Reserve(ctx, c)
	require.NoError(t, err)
	require.NoError(t, m.Release(ctx, c.Ref, c.Owner))
	_, err = m.Settle(ctx, c.Ref, actual, ledger.SourceFinal) // protocol violation
	require.NoError(t, err)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 4)
	assert.Equal(t, ledger.UsageEvent{Ref: a.Ref, Scopes: [ledger.MaxScopes]ledger.ScopeRef{{Kind: ledger.KindTenant, Key: jTenant}},
		NScopes: 1, Held: a.Held, Actual: actual, Charged: actual, Source: ledger.SourceFinal, State: ledger.Settled,
		AdmittedAt: jT0, At: jT0}, events[0])
	assert.Equal(t, ledger.Charged, events[1].State)
	assert.Equal(t, b.Held, events[1].Charged)
	assert.Equal(t, ledger.SourceResolved, events[1].Source)
	assert.Equal(t, ledger.Charged, events[2].State, "a Settle after CHARGED goes to the usage log")
	assert.Equal(t, actual, events[2].Actual)
	assert.Equal(t, ledger.Amounts{}, events[2].Charged)
	assert.Equal(t, ledger.SettledLate, events[3].State)
	require.Len(t, alerts, 1)
	assert.Equal(t, "settled_late", alerts[0].Reason)
	assert.InDelta(t, 1.0, counterValue(t, reg, "sluice_ledger_alerts_total"), 0)
}

// counterValue sums every series of a counter family.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			total := 0.0
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
			return total
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func TestMemoryAdjust(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: jT0}
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: clock.Now, Logger: quiet})
	require.NoError(t, err)
	ctx := t.Context()
	r := jReq(4)
	_, err = m.Reserve(ctx, r)
	require.NoError(t, err)
	_, err = m.Settle(ctx, r.Ref, r.Held, ledger.SourceFinal)
	require.NoError(t, err)
	require.Equal(t, int64(5), m.Committed(jTenant, jTenant, ledger.Tokens, 24*time.Hour))
	tests := []struct {
		name  string
		delta int64
		want  error
		c     int64
	}{
		{"lower", -3, nil, 2},
		{"below zero", -3, ledger.ErrInvalid, 2},
		{"raise", 10, nil, 12},
	}
	for _, tc := range tests {
		err := m.Adjust(ctx, jTenant, jTenant, ledger.Tokens, 24*time.Hour, tc.delta)
		if tc.want != nil {
			require.ErrorIs(t, err, tc.want, tc.name)
		} else {
			require.NoError(t, err, tc.name)
		}
		assert.Equal(t, tc.c, m.Committed(jTenant, jTenant, ledger.Tokens, 24*time.Hour), tc.name)
	}
	require.ErrorIs(t, m.Adjust(ctx, jTenant, jTenant, ledger.Tokens, time.Hour, 1), ledger.ErrNotFound)
	require.NoError(t, m.Audit(), "adjustments are accounted for")
}

func TestMemoryConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  ledger.MemoryConfig
	}{
		{"max below lease", ledger.MemoryConfig{LeaseTTL: time.Minute, MaxLeaseTTL: time.Second}},
		{"retention below 2·max lease", ledger.MemoryConfig{LeaseTTL: time.Minute, TombstoneRetention: time.Minute}},
		{"negative reclaim interval", ledger.MemoryConfig{ReclaimInterval: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Logger = quiet
			_, err := ledger.NewMemory(tc.cfg)
			assert.ErrorIs(t, err, ledger.ErrInvalid)
		})
	}
}

func TestMemoryCanceledContextIsUnavailable(t *testing.T) {
	t.Parallel()
	m, err := ledger.NewMemory(ledger.MemoryConfig{Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = m.Reserve(ctx, jReq(0))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	assert.True(t, ledger.IsStoreError(err))
	assert.ErrorIs(t, err, context.Canceled)
}
