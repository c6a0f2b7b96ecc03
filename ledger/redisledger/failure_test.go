package redisledger_test

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// TestT3DuplicateReserve: the same id 100x from 2 processes at once → 1 grant
// without Replayed, 99 with it, one LeaseExpiry; +h once; a changed payload
// gets ErrConflict and changes nothing.
func TestT3DuplicateReserve(t *testing.T) {
	if os.Getenv("SLUICE_CHILD") == "1" {
		t.Skip("parent test")
	}
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	id := ledger.NewRequestID()
	wait := spawn(t, 2, "SLUICE_CHILD_MODE=dupreserve", "SLUICE_REDIS="+srv.Addr(), "SLUICE_REDIS_DIRECT="+srv.Addr(),
		"SLUICE_ID="+hex.EncodeToString(id[:]))
	barrier(ctx, t, rc, "t3", 2)
	wait()
	assert.Equal(t, int64(1), hgetInt(t, rc, "test:res:t3", "replayed=false"))
	assert.Equal(t, int64(99), hgetInt(t, rc, "test:res:t3", "replayed=true"))
	assert.Equal(t, int64(0), hgetInt(t, rc, "test:res:t3", "other"))
	leases, err := rc.SMembers(ctx, "test:lease:t3").Result()
	require.NoError(t, err)
	assert.Len(t, leases, 1, "every grant has the same LeaseExpiry")

	sc := tenantScope("t3", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})
	u, err := l.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, int64(7), u.Reserved[ledger.Tokens], "counters +h once")

	before := dumpTenant(t, rc, sc.Key)
	req := reserveReq([]ledger.Scope{sc}, held(8), ledger.NewOwner())
	req.Ref.ID = id
	_, err = l.Reserve(ctx, req)
	require.ErrorIs(t, err, ledger.ErrConflict)
	assert.Equal(t, before, dumpTenant(t, rc, sc.Key), "a conflicting payload writes nothing")
}

// TestT5DuplicateSettle: the same actual 104x from 8 processes → one
// Replayed=false; c += a once, r −= h once; a different actual is ErrConflict.
func TestT5DuplicateSettle(t *testing.T) {
	if os.Getenv("SLUICE_CHILD") == "1" {
		t.Skip("parent test")
	}
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	sc := tenantScope("t5", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})
	owner := ledger.NewOwner()
	req := reserveReq([]ledger.Scope{sc}, held(9), owner)
	req.Dispatch = true
	_, err := l.Reserve(ctx, req)
	require.NoError(t, err)

	wait := spawn(t, 8, "SLUICE_CHILD_MODE=dupsettle", "SLUICE_REDIS="+srv.Addr(), "SLUICE_REDIS_DIRECT="+srv.Addr(),
		"SLUICE_ID="+hex.EncodeToString(req.Ref.ID[:]))
	barrier(ctx, t, rc, "t5", 8)
	wait()
	assert.Equal(t, int64(1), hgetInt(t, rc, "test:res:t5", "replayed=false"))
	assert.Equal(t, int64(8*13-1), hgetInt(t, rc, "test:res:t5", "replayed=true"))
	assert.Equal(t, int64(0), hgetInt(t, rc, "test:res:t5", "other"))
	u, err := l.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(5), u.Limits[0].Committed)

	_, err = l.Settle(ctx, req.Ref, held(6), ledger.SourceFinal)
	require.ErrorIs(t, err, ledger.ErrConflict)
	u, err = l.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, int64(5), u.Limits[0].Committed, "c unchanged by the conflicting settle")
}

// fcallOrEvalsha returns the server's EVALSHA and FCALL calls so far: a batch
// runs as FCALL of the function library.
func fcallOrEvalsha(t *testing.T, rc *redis.Client) int64 {
	t.Helper()
	return commandCalls(t, rc, "evalsha") + commandCalls(t, rc, "fcall")
}

func commandCalls(t *testing.T, rc *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			var v int64
			for _, c := range n {
				v = v*10 + int64(c-'0')
			}
			return v
		}
	}
	return 0
}

// TestT4RetriesBehindDelayingProxy: replies delayed 120 ms, ReadTimeout 50 ms,
// default MaxRetries: Redis runs the Reserve more than once, the counters move
// once, the caller gets ErrAmbiguous; a replay returns Replayed and a Release
// restores the baseline exactly.
func TestT4RetriesBehindDelayingProxy(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	direct := newLedger(t, srv.Addr(), nil)
	require.NoError(t, direct.LoadScripts(ctx))
	proxy := startDelayProxy(t, srv.Addr(), 120*time.Millisecond)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 50 * time.Millisecond,
		WriteTimeout: 50 * time.Millisecond, ContextTimeoutEnabled: true,
		Protocol: 2, DisableIdentity: true}) // the handshake is one reply, which the proxy passes at once
	t.Cleanup(func() { _ = client.Close() })
	slow, err := redisledger.New(client, redisledger.Config{LeaseTTL: 10 * time.Second})
	require.NoError(t, err)

	sc := tenantScope("t4", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})
	owner := ledger.NewOwner()
	warm := reserveReq([]ledger.Scope{sc}, held(1), owner)
	_, err = direct.Reserve(ctx, warm)
	require.NoError(t, err)
	require.NoError(t, direct.Release(ctx, warm.Ref, owner))
	base, err := direct.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	calls0 := fcallOrEvalsha(t, rc)

	req := reserveReq([]ledger.Scope{sc}, held(100), owner)
	_, err = slow.Reserve(ctx, req)
	require.ErrorIs(t, err, ledger.ErrAmbiguous)
	assert.True(t, ledger.IsStoreError(err))
	proxy.Close() // drains the delayed replies
	runs := fcallOrEvalsha(t, rc) - calls0
	assert.GreaterOrEqual(t, runs, int64(2), "go-redis retried the script after the read timeout")

	u, err := direct.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, base.Reserved[ledger.Tokens]+100, u.Reserved[ledger.Tokens], "applied exactly once despite %d runs", runs)

	g, err := direct.Reserve(ctx, req)
	require.NoError(t, err)
	assert.True(t, g.Replayed)
	require.NoError(t, direct.Release(ctx, req.Ref, owner)) // the outbox's Release
	u, err = direct.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, base.Reserved, u.Reserved)
	assert.Equal(t, base.Limits[0].Committed, u.Limits[0].Committed)
}

// TestT9StoreDown: with redis-server stopped every Reserve fails with a store
// error within StoreTimeout (+ scheduling margin); after a restart (state lost) the tenant is
// fenced (ErrRecovering) until MaxLeaseTTL passes, then grants again.
func TestT9StoreDown(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	const storeTimeout = 250 * time.Millisecond
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.StoreTimeout = storeTimeout })
	sc := []ledger.Scope{tenantScope("t9", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40})}
	owner := ledger.NewOwner()
	_, err := l.Reserve(ctx, reserveReq(sc, held(1), owner))
	require.NoError(t, err)

	srv.Stop()
	var mu sync.Mutex
	var worst time.Duration
	var bad []error
	parallel(32, func() {
		for range 5 {
			start := time.Now()
			_, err := l.Reserve(ctx, reserveReq(sc, held(1), owner))
			el := time.Since(start)
			mu.Lock()
			worst = max(worst, el)
			if !errors.Is(err, ledger.ErrUnavailable) && !errors.Is(err, ledger.ErrAmbiguous) {
				bad = append(bad, err)
			}
			mu.Unlock()
		}
	})
	assert.Empty(t, bad, "every Reserve fails with ErrUnavailable or ErrAmbiguous")
	// Bounded by StoreTimeout, not by go-redis's retries and dial backoff
	// (seconds); the half-timeout margin is for a loaded host's scheduling
	// under -race, and still fails a second attempt after a timeout.
	assert.LessOrEqual(t, worst, storeTimeout+storeTimeout/2, "slowest failure")

	srv.Start() // empty: the store lost everything
	// go-redis keeps answering its last dial error until its own background
	// redial succeeds; wait for that (bounded) before asserting the fence.
	deadline := time.Now().Add(10 * time.Second)
	for l.Ping(ctx) != nil {
		require.True(t, time.Now().Before(deadline), "client did not reconnect after restart")
		time.Sleep(20 * time.Millisecond)
	}
	_, err = l.Reserve(ctx, reserveReq(sc, held(1), owner))
	require.ErrorIs(t, err, ledger.ErrRecovering, "a cached epoch missing from the store fences the tenant")
	rc := srv.Client(t)
	advance(t, rc, sc[0].Key, 20*time.Second+time.Millisecond) // MaxLeaseTTL = 2·10s
	_, err = l.Reserve(ctx, reserveReq(sc, held(1), owner))
	require.NoError(t, err)
	fresh := newLedger(t, srv.Addr(), nil)
	_, err = fresh.Reserve(ctx, reserveReq([]ledger.Scope{tenantScope("t9-new", sc[0].Limits...)}, held(1), owner))
	require.NoError(t, err, "a process with no cached epoch never fences a new tenant")
}

// TestT10StorePaused: CLIENT PAUSE WRITE during Reserve → ErrAmbiguous;
// after lease + reclaim every counter equals the pre-test snapshot.
func TestT10StorePaused(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.StoreTimeout = 250 * time.Millisecond })
	sc := tenantScope("t10", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})
	owner := ledger.NewOwner()
	warm := reserveReq([]ledger.Scope{sc}, held(1), owner)
	_, err := l.Reserve(ctx, warm)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx, warm.Ref, owner))
	base, err := l.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)

	require.NoError(t, rc.Do(ctx, "CLIENT", "PAUSE", 2000, "WRITE").Err())
	_, err = l.Reserve(ctx, reserveReq([]ledger.Scope{sc}, held(50), owner))
	require.ErrorIs(t, err, ledger.ErrAmbiguous)
	require.NoError(t, rc.Do(ctx, "CLIENT", "UNPAUSE").Err())

	advance(t, rc, sc.Key, 11*time.Second) // past the 10s lease
	_, err = l.Reclaim(ctx, sc.Key, 100)
	require.NoError(t, err)
	u, err := l.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, base.Reserved, u.Reserved)
	assert.Equal(t, base.SlotsInUse, u.SlotsInUse)
	assert.Equal(t, base.Limits[0].Committed, u.Limits[0].Committed)
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			var s float64
			for _, m := range mf.GetMetric() {
				s += m.GetCounter().GetValue()
			}
			return s
		}
	}
	return 0
}

// TestT11CorruptState: negative r, a non-integer field, an unknown state and
// a lease entry without record each give ErrCorrupt with every key of the
// tenant byte-identical (DUMP) before and after; other tenants still grant;
// the alert counter rises.
func TestT11CorruptState(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.Registerer = reg })
	other := []ledger.Scope{tenantScope("t11-other", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})}
	owner := ledger.NewOwner()

	for _, tc := range []struct {
		name    string
		corrupt func(tenant ledger.ScopeKey, ref ledger.Ref)
		op      func(ref ledger.Ref, sc []ledger.Scope) error
	}{
		{
			name: "negative_r",
			corrupt: func(tenant ledger.ScopeKey, _ ledger.Ref) {
				rc.HSet(ctx, "sluice:{"+tenant.String()+"}:s:"+tenant.String(), "r:3", "-5")
			},
			op: func(_ ledger.Ref, sc []ledger.Scope) error {
				_, err := l.Reserve(ctx, reserveReq(sc, held(1), owner))
				return err
			},
		},
		{
			name: "non_integer_committed",
			corrupt: func(tenant ledger.ScopeKey, _ ledger.Ref) {
				rc.HSet(ctx, "sluice:{"+tenant.String()+"}:s:"+tenant.String(), "c:3:3600", "1.5")
			},
			op: func(ref ledger.Ref, _ []ledger.Scope) error {
				_, err := l.Settle(ctx, ref, held(3), ledger.SourceFinal)
				return err
			},
		},
		{
			name: "non_canonical_integer",
			corrupt: func(tenant ledger.ScopeKey, _ ledger.Ref) {
				// r:0 (requests) is a counter the Settle releases; an operation
				// checks only the fields it reads or writes (this scope has no
				// slot limit, so n is neither).
				rc.HSet(ctx, "sluice:{"+tenant.String()+"}:s:"+tenant.String(), "r:0", "01")
			},
			op: func(ref ledger.Ref, _ []ledger.Scope) error {
				_, err := l.Settle(ctx, ref, held(3), ledger.SourceFinal)
				return err
			},
		},
		{
			name: "scope_key_of_wrong_type",
			corrupt: func(tenant ledger.ScopeKey, _ ledger.Ref) {
				k := "sluice:{" + tenant.String() + "}:s:" + tenant.String()
				rc.Del(ctx, k)
				rc.Set(ctx, k, "x", 0)
			},
			op: func(_ ledger.Ref, sc []ledger.Scope) error {
				_, err := l.Reserve(ctx, reserveReq(sc, held(1), owner))
				return err
			},
		},
		{
			name: "unknown_state",
			corrupt: func(tenant ledger.ScopeKey, ref ledger.Ref) {
				k := ledger.ScopeKey(ref.ID)
				require.NoError(t, setRecordField(ctx, rc, "sluice:{"+tenant.String()+"}:q:"+k.String(), "st", "99"))
			},
			op: func(ref ledger.Ref, _ []ledger.Scope) error {
				_, err := l.Settle(ctx, ref, held(3), ledger.SourceFinal)
				return err
			},
		},
		{
			name: "lease_without_record",
			corrupt: func(tenant ledger.ScopeKey, _ ledger.Ref) {
				ghost := ledger.ScopeKey(ledger.NewRequestID())
				rc.ZAdd(ctx, "sluice:{"+tenant.String()+"}:L", redis.Z{Score: 1, Member: ghost.String()})
			},
			op: func(ref ledger.Ref, _ []ledger.Scope) error {
				_, err := l.Reclaim(ctx, ref.Tenant, 10)
				return err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := []ledger.Scope{tenantScope("t11-"+tc.name, ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})}
			req := reserveReq(sc, held(5), owner)
			req.Dispatch = true
			_, err := l.Reserve(ctx, req)
			require.NoError(t, err)
			tc.corrupt(sc[0].Key, req.Ref)
			alerts := counterValue(t, reg, "sluice_ledger_corrupt_total")
			before := dumpTenant(t, rc, sc[0].Key)

			err = tc.op(req.Ref, sc)
			require.ErrorIs(t, err, ledger.ErrCorrupt)
			after := dumpTenant(t, rc, sc[0].Key)
			assert.Equal(t, sortedKeys(before), sortedKeys(after))
			assert.Equal(t, before, after, "nothing written, nothing clamped")
			assert.InDelta(t, alerts+1, counterValue(t, reg, "sluice_ledger_corrupt_total"), 1e-9)

			_, err = l.Reserve(ctx, reserveReq(other, held(1), owner))
			require.NoError(t, err, "other tenants still grant")
		})
	}
}

// TestT12MalformedPolicy: bad limits and versions are ErrPolicy, bad amounts
// ErrInvalid, and none writes anything.
func TestT12MalformedPolicy(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	owner := ledger.NewOwner()
	good := ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}
	tenant := testKeyer.Key(ledger.KindTenant, "t12")
	// Establish the tenant at policy version 5.
	base := reserveReq([]ledger.Scope{{Kind: ledger.KindTenant, Key: tenant, Limits: []ledger.Limit{good}}}, held(1), owner)
	base.PolicyVersion = 5
	_, err := l.Reserve(ctx, base)
	require.NoError(t, err)
	otherSc := []ledger.Scope{tenantScope("t12-other", good)}

	over := held(1)
	over[ledger.InputTokens] = ledger.MaxAmount + 1
	over[ledger.Tokens] = ledger.MaxAmount + 1
	mismatch := held(1)
	mismatch[ledger.Tokens] = 2

	for _, tc := range []struct {
		name    string
		limits  []ledger.Limit
		version uint64
		held    ledger.Amounts
		want    error
	}{
		{name: "negative_limit", limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: -1}}, want: ledger.ErrPolicy},
		{name: "limit_over_2^50", limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount + 1}}, want: ledger.ErrPolicy},
		{name: "window_zero", limits: []ledger.Limit{{Dim: ledger.Tokens, Max: 10}}, want: ledger.ErrPolicy},
		{name: "window_fractional", limits: []ledger.Limit{{Dim: ledger.Tokens, Window: 1500 * time.Millisecond, Max: 10}}, want: ledger.ErrPolicy},
		{name: "window_over_31d", limits: []ledger.Limit{{Dim: ledger.Tokens, Window: 32 * 24 * time.Hour, Max: 10}}, want: ledger.ErrPolicy},
		{name: "window_on_slots", limits: []ledger.Limit{{Dim: ledger.Slots, Window: time.Hour, Max: 10}}, want: ledger.ErrPolicy},
		{name: "no_policy", limits: nil, want: ledger.ErrPolicy},
		{name: "amount_over_2^50", limits: []ledger.Limit{good}, version: 5, held: over, want: ledger.ErrInvalid},
		{name: "tokens_not_sum", limits: []ledger.Limit{good}, version: 5, held: mismatch, want: ledger.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.held
			if h == (ledger.Amounts{}) {
				h = held(1)
			}
			req := reserveReq([]ledger.Scope{{Kind: ledger.KindTenant, Key: tenant, Limits: tc.limits}}, h, owner)
			req.PolicyVersion = tc.version
			before := dumpTenant(t, rc, tenant)
			_, err := l.Reserve(ctx, req)
			require.ErrorIs(t, err, tc.want)
			assert.Equal(t, before, dumpTenant(t, rc, tenant), "no writes")
			_, err = l.Reserve(ctx, reserveReq(otherSc, held(1), owner))
			require.NoError(t, err, "other tenants unaffected")
		})
	}
}
