package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/statestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRestartAfterAdminChange: clamp and unclamp (policy version
// 3 on this process), restart on the same journal (version 1 again): the
// tenant is served, and the committed usage is kept.
func TestRestartAfterAdminChange(t *testing.T) {
	dir := t.TempDir()
	open := func() *ledger.Memory {
		m, err := ledger.NewMemory(ledger.MemoryConfig{Journal: dir + "/journal", LeaseTTL: 60 * time.Second})
		require.NoError(t, err)
		return m
	}
	cfg := lifecycletest.Config(t, "", "    budgets:\n      - {dimension: tokens, limit: 1000000, window: 24h}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	m1 := open()
	s1 := newTestServer(t, cfg, lifecycletest.LedgerOn(m1), &lifecycletest.Upstream{Out: 3})
	go s1.DispatchLoop(ctx)
	_, err := s1.SetClamp(Clamp{Tenant: "acme", Concurrency: 1, Reason: "test", ExpiresAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = s1.Unclamp("acme")
	require.NoError(t, err)
	require.Equal(t, uint64(3), s1.pol.Load().Version)
	_, err = serve(ctx, s1, lifecycle.Admission{Body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	require.NoError(t, m1.Close())

	m2 := open()
	defer m2.Close()
	s2 := newTestServer(t, cfg, lifecycletest.LedgerOn(m2), &lifecycletest.Upstream{Out: 3})
	go s2.DispatchLoop(ctx)
	require.Equal(t, uint64(1), s2.pol.Load().Version)
	_, err = serve(ctx, s2, lifecycle.Admission{Body: lifecycletest.ChatBody("")})
	require.NoError(t, err, "served after the restart, not 500 ledger_error")
	assert.Equal(t, int64(2*(5+3)), lifecycletest.Committed(tenantUsage(t, s2, m2), ledger.Tokens, 24*time.Hour), "usage of both runs kept")
}

// TestAdminSharedFleetWide: a budget set and a clamp applied
// through instance A are enforced by instance B (shared state store), and
// B's unclamp is seen by A.
func TestAdminSharedFleetWide(t *testing.T) {
	store, err := statestore.OpenFile(t.TempDir())
	require.NoError(t, err)
	led := lifecycletest.NewLedger(t)
	cfg := lifecycletest.Config(t, "", "    concurrency: 8\n")
	mk := func() *Server {
		keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
		require.NoError(t, err)
		mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, Replicas: []gpu.Replica{{Name: "r0", CapacityTokens: 1 << 20}}}, gpu.Deps{})
		require.NoError(t, err)
		s, err := New(cfg, Deps{Ledger: led, Upstream: &lifecycletest.Upstream{Out: 3}, Keyer: keyer, GPU: mon, State: store})
		require.NoError(t, err)
		s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1 << 20})
		return s
	}
	a, b := mk(), mk()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.DispatchLoop(ctx)
	go b.DispatchLoop(ctx)
	poll := func(s *Server) {
		d, err := store.Get(ctx, policy.AdminDoc)
		require.NoError(t, err)
		s.admin.Apply(d)
	}

	_, err = a.SetBudget("acme", config.Budget{Dimension: "requests", Limit: 1, Window: time.Hour})
	require.NoError(t, err)
	_, err = a.SetClamp(Clamp{Tenant: "acme", Concurrency: 2, Reason: "suspicious", ExpiresAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	poll(b)
	assert.Equal(t, 2, b.pol.Load().Tenants["acme"].Cfg.Concurrency, "A's clamp applies on B")

	_, err = serve(ctx, b, lifecycle.Admission{Body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	_, err = serve(ctx, b, lifecycle.Admission{Body: lifecycletest.ChatBody("")})
	assert.Equal(t, 429, apierr.For(err).Status, "A's budget of 1 request is enforced by B: %v", err)

	had, err := b.Unclamp("acme")
	require.NoError(t, err)
	assert.True(t, had)
	poll(a)
	assert.Equal(t, 8, a.pol.Load().Tenants["acme"].Cfg.Concurrency, "B's unclamp is seen by A")
	assert.Len(t, a.Budgets("acme"), 1, "the budget survived the concurrent changes")
}
