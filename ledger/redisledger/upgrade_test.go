package redisledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// toHashLayout rewrites the record of ref as the version before the packed
// layout stored it: one hash, every field as text, absent fields left out.
func toHashLayout(t *testing.T, rc *redis.Client, ref ledger.Ref) string {
	t.Helper()
	ctx := context.Background()
	key := "sluice:{" + ref.Tenant.String() + "}:q:" + ledger.ScopeKey(ref.ID).String()
	f, err := recordFields(ctx, rc, key)
	require.NoError(t, err)
	require.NotEmpty(t, f)
	require.Equal(t, "string", rc.Type(ctx, key).Val(), "written packed")
	if f["sl"] == "" {
		f["sl"] = "0" // the hash layout always wrote sl
	}
	args := []any{}
	for k, v := range f {
		args = append(args, k, v)
	}
	require.NoError(t, rc.Del(ctx, key).Err())
	require.NoError(t, rc.HSet(ctx, key, args...).Err())
	return key
}

// TestHashLayoutRecords: records written by the version before the packed
// layout (a rolling upgrade) are listed, settled (by the Ledger that
// reserved them and by one that does not know their scopes), replayed,
// released and expired by this version with exact counters, and written
// back packed, as tombstones with a time to live.
func TestHashLayoutRecords(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	other := newLedger(t, srv.Addr(), nil)
	owner := ledger.NewOwner()
	sc := []ledger.Scope{tenantScope("upgrade",
		ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}, ledger.Limit{Dim: ledger.Slots, Max: 10})}
	tenant := sc[0].Key

	reserve := func(tokens int64, dispatch bool, ttl time.Duration) (ledger.Ref, string) {
		req := reserveReq(sc, held(tokens), owner)
		req.Dispatch, req.LeaseTTL = dispatch, ttl
		_, err := l.Reserve(ctx, req)
		require.NoError(t, err)
		return req.Ref, toHashLayout(t, rc, req.Ref)
	}
	packedTombstone := func(key string) {
		t.Helper()
		require.Equal(t, "string", rc.Type(ctx, key).Val())
		require.Greater(t, rc.PTTL(ctx, key).Val(), time.Duration(0))
	}

	settled, k1 := reserve(100, true, 0)
	byOther, k2 := reserve(200, true, 0)
	released, k3 := reserve(50, false, 0)
	_, k4 := reserve(30, false, time.Second)
	_, k5 := reserve(40, true, time.Second)

	list, err := l.List(ctx, tenant, ledger.Dispatched, 10)
	require.NoError(t, err)
	require.Len(t, list, 3)
	var listed int64
	for _, x := range list {
		listed += x.Held[ledger.Tokens]
	}
	require.Equal(t, int64(100+200+40), listed)

	s, err := l.Settle(ctx, settled, held(60), ledger.SourceFinal)
	require.NoError(t, err)
	require.Equal(t, ledger.Settled, s.State)
	require.Equal(t, int64(60), s.Charged[ledger.Tokens])
	packedTombstone(k1)
	s, err = l.Settle(ctx, settled, held(60), ledger.SourceFinal)
	require.NoError(t, err)
	require.True(t, s.Replayed)

	s, err = other.Settle(ctx, byOther, held(250), ledger.SourceFinal)
	require.NoError(t, err)
	require.Equal(t, ledger.Settled, s.State)
	require.Equal(t, int64(250), s.Charged[ledger.Tokens])
	require.Equal(t, int64(50), s.Overrun[ledger.Tokens])
	packedTombstone(k2)

	require.NoError(t, l.Release(ctx, released, owner))
	packedTombstone(k3)

	advance(t, rc, tenant, 2*time.Second)
	st, err := l.Reclaim(ctx, tenant, 100)
	require.NoError(t, err)
	require.Equal(t, 1, st.Expired)
	require.Equal(t, 1, st.Unresolved)
	packedTombstone(k4)
	require.Equal(t, "string", rc.Type(ctx, k5).Val(), "UNRESOLVED, packed")
	require.Equal(t, time.Duration(-1), rc.PTTL(ctx, k5).Val(), "an open record has no time to live")

	u, err := l.Snapshot(ctx, tenant, tenant)
	require.NoError(t, err)
	require.Equal(t, int64(40), u.Reserved[ledger.Tokens], "only the UNRESOLVED hold is left")
	require.Equal(t, int64(0), u.SlotsInUse)
	for _, lu := range u.Limits {
		if lu.Limit.Dim == ledger.Tokens {
			require.Equal(t, int64(60+250), lu.Committed)
		}
	}
}
