package ledgertest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// testPolicyVersionUnordered: an older PolicyVersion is accepted (issue 13
// item 1: the version counter restarts at 1 with the process and differs
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
