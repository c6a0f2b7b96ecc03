package ledgertest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// testPolicyVersionUnordered: an older PolicyVersion is accepted (the
// version counter restarts at 1 with the process and differs
// between instances), on every front end and after a restart, and Snapshot
// reports the version of the last admitted Reserve.
func testPolicyVersionUnordered(t *testing.T, f Factory) {
	cfg := DefaultConfig()
	cfg.Durable = true
	b := f(t, cfg)
	ctx := t.Context()
	tenant := newKey(1)
	l := b.Ledger
	reserve := func(l ledger.Ledger, pv uint64) {
		t.Helper()
		r := simpleReq(tenant, tokens(1, 1), false, lim(ledger.Tokens, time.Hour, 100))
		r.PolicyVersion = pv
		g, err := l.Reserve(ctx, r)
		require.NoError(t, err, "policy version %d", pv)
		assert.False(t, g.Replayed)
		u, err := l.Snapshot(ctx, tenant, tenant)
		require.NoError(t, err)
		assert.Equal(t, pv, u.PolicyVersion, "recorded version")
	}
	reserve(l, 9)
	reserve(l, 4)
	reserve(l, 1)
	for _, p := range b.Peers {
		reserve(p, 2) // another instance's counter
	}
	if b.Restart != nil {
		var err error
		l, err = b.Restart()
		require.NoError(t, err)
		reserve(l, 1) // the counter restarted
	}
	u, err := l.Snapshot(ctx, tenant, tenant)
	require.NoError(t, err)
	want := int64(3 + len(b.Peers))
	if b.Restart != nil {
		want = 1 // the restart expired the earlier RESERVED holds
	}
	assert.Equal(t, 2*want, u.Reserved[ledger.Tokens])
}

// testGPUJoules: gpu_joules (integer millijoules) is a
// windowed budget like gpu_ms: held, denied when full, charged at Settle,
// reported by Snapshot and Headroom.
func testGPUJoules(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	ctx := t.Context()
	alignToWindow(b, time.Hour, time.Second)
	tenant := newKey(1)
	limits := []ledger.Limit{lim(ledger.GPUJoules, time.Hour, 10_000), lim(ledger.GPUMs, time.Hour, 1_000_000)}
	h := tokens(1, 1)
	h[ledger.GPUJoules], h[ledger.GPUMs] = 6_000, 100
	r1 := simpleReq(tenant, h, true, limits...)
	g, err := b.Ledger.Reserve(ctx, r1)
	require.NoError(t, err)
	assert.Equal(t, ledger.Room{Tracked: true, Limit: 10_000, Remaining: 4_000, Window: time.Hour,
		ResetsAt: g.Headroom[ledger.GPUJoules].ResetsAt}, g.Headroom[ledger.GPUJoules])
	_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, h, true, limits...))
	d, ok := isDenied(err)
	require.True(t, ok, "second hold does not fit: %v", err)
	assert.Equal(t, ledger.GPUJoules, d.Dim)
	assert.Equal(t, int64(6_000), d.Reserved)
	assert.Equal(t, int64(6_000), d.Requested)

	u := usage(t, b, tenant, tenant)
	assert.Equal(t, int64(6_000), u.Reserved[ledger.GPUJoules])
	a := tokens(1, 1)
	a[ledger.GPUJoules], a[ledger.GPUMs] = 2_500, 80
	st, err := b.Ledger.Settle(ctx, r1.Ref, a, ledger.SourceFinal)
	require.NoError(t, err)
	assert.Equal(t, a, st.Charged)
	u = usage(t, b, tenant, tenant)
	assert.Zero(t, u.Reserved[ledger.GPUJoules])
	assert.Equal(t, int64(2_500), committed(u, ledger.GPUJoules, time.Hour))
	assert.Equal(t, int64(80), committed(u, ledger.GPUMs, time.Hour))

	_, err = b.Ledger.Reserve(ctx, simpleReq(tenant, h, true, limits...))
	require.NoError(t, err, "6000 + 2500 fits in 10000")
	over := a
	over[ledger.GPUJoules] = 7_000
	r3 := simpleReq(tenant, h, false, limits...)
	_, err = b.Ledger.Reserve(ctx, r3)
	_, ok = isDenied(err)
	require.True(t, ok, "2500 + 6000 + 6000 > 10000: %v", err)
	auditClean(t, b, tenant)
}
