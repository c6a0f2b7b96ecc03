package redisledger_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// pauseAndQueue pauses Redis writes, starts n calls of fn, waits until the
// batcher holds them (two calls in flight, the rest queued), and unpauses.
func pauseAndQueue(t *testing.T, srv *redisServer, pause time.Duration, n int, fn func(i int)) {
	t.Helper()
	rc := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, rc.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err())
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fn(i) })
	}
	wg.Wait()
}

func histCount(t *testing.T, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// TestBatchIsolatesARaisingOperation: concurrent Reserves queue behind a
// paused Redis and go in shared calls; one of them names a scope key that
// holds a string (a redis.call in its operation raises WRONGTYPE). That one
// fails ErrCorrupt having written nothing; every other operation of its
// batch is admitted, and the holds add up exactly.
func TestBatchIsolatesARaisingOperation(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.Registerer = reg })
	require.NoError(t, l.LoadScripts(ctx))
	good := []ledger.Scope{tenantScope("batch-good", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30})}
	bad := []ledger.Scope{tenantScope("batch-bad", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30})}
	owner := ledger.NewOwner()
	for _, sc := range [][]ledger.Scope{good, bad} { // register both partitions (one SADD each) before the pause
		w := reserveReq(sc, held(1), owner)
		_, err := l.Reserve(ctx, w)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx, w.Ref, owner))
	}
	badKey := "sluice:{" + bad[0].Key.String() + "}:s:" + bad[0].Key.String()
	require.NoError(t, rc.Del(ctx, badKey).Err())
	require.NoError(t, rc.Set(ctx, badKey, "not a hash", 0).Err())
	count0, sum0 := histCount(t, reg, "sluice_ledger_redis_batch_ops")

	const n = 40
	errs := make([]error, n)
	pauseAndQueue(t, srv, 300*time.Millisecond, n, func(i int) {
		sc := good
		if i == n/2 {
			sc = bad
		}
		_, errs[i] = l.Reserve(ctx, reserveReq(sc, held(10), owner))
	})
	for i, err := range errs {
		if i == n/2 {
			require.ErrorIs(t, err, ledger.ErrCorrupt, "the raising operation")
			continue
		}
		require.NoError(t, err, "operation %d shares a batch with the raising one", i)
	}
	u, err := l.Snapshot(ctx, good[0].Key, good[0].Key)
	require.NoError(t, err)
	assert.Equal(t, int64(10*(n-1)), u.Reserved[ledger.Tokens], "every admitted hold exactly once")
	typ, err := rc.Type(ctx, badKey).Result()
	require.NoError(t, err)
	assert.Equal(t, "string", typ, "nothing written over the damaged key")
	count, sum := histCount(t, reg, "sluice_ledger_redis_batch_ops")
	calls, ops := count-count0, sum-sum0
	assert.InDelta(t, float64(n), ops, 1e-9, "every operation went through the batcher once")
	assert.Less(t, calls, uint64(n), "operations shared calls (%d calls for %v operations)", calls, ops)
}

// TestBatchQueuedPastTheTimeoutIsNotSent: with Redis paused longer than
// StoreTimeout, the operations of the (at most two) calls in flight end
// ErrAmbiguous and every operation still queued ends ErrUnavailable within
// StoreTimeout, without ever reaching Redis (its record does not exist).
func TestBatchQueuedPastTheTimeoutIsNotSent(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	// MaxBatch 4: at most two calls of four operations are in flight, so
	// of the 30 operations at least 22 are still queued when the pause
	// outlasts StoreTimeout, however the goroutines are scheduled.
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.StoreTimeout = 200 * time.Millisecond; c.MaxBatch = 4 })
	require.NoError(t, l.LoadScripts(ctx))
	sc := []ledger.Scope{tenantScope("batch-timeout", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30})}
	owner := ledger.NewOwner()
	w := reserveReq(sc, held(1), owner)
	_, err := l.Reserve(ctx, w)
	require.NoError(t, err)

	const n = 30
	errs := make([]error, n)
	reqs := make([]ledger.ReserveRequest, n)
	for i := range reqs {
		reqs[i] = reserveReq(sc, held(1), owner)
	}
	pauseAndQueue(t, srv, 1500*time.Millisecond, n, func(i int) {
		start := time.Now()
		_, errs[i] = l.Reserve(ctx, reqs[i])
		assert.Less(t, time.Since(start), time.Second, "bounded by StoreTimeout, not by the pause")
	})
	var unavailable, ambiguous int
	for i, err := range errs {
		switch {
		case errors.Is(err, ledger.ErrUnavailable):
			unavailable++
			// Reads are not paused: the record must not exist.
			n, err := rc.Exists(ctx, "sluice:{"+sc[0].Key.String()+"}:q:"+ledger.ScopeKey(reqs[i].Ref.ID).String()).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "an operation that never left the queue wrote nothing")
		case errors.Is(err, ledger.ErrAmbiguous):
			ambiguous++
		default:
			t.Errorf("operation %d: %v", i, err)
		}
	}
	assert.Equal(t, n, ambiguous+unavailable)
	assert.Positive(t, ambiguous, "the calls in flight")
	assert.Positive(t, unavailable, "the operations queued behind them")
}

// TestBatchScopeCacheAndLibrary: Reserves (with a slot) and Settles of one
// tenant and one API key queue behind a paused Redis and share calls, so
// each call reads and writes those two scope hashes once for many
// operations (the scope cache in prelude.lua). The counters are exact
// through the function library, after FUNCTION FLUSH (the ledger loads the
// library again, nothing runs twice) and through the batch script (EVALSHA,
// a server without functions).
func TestBatchScopeCacheAndLibrary(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	require.NoError(t, l.LoadScripts(ctx))
	sc := []ledger.Scope{
		tenantScope("batch-cache", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30},
			ledger.Limit{Dim: ledger.Requests, Window: time.Minute, Max: 1 << 20}, ledger.Limit{Dim: ledger.Slots, Max: 1000}),
		{Kind: ledger.KindAPIKey, Key: testKeyer.Key(ledger.KindAPIKey, "batch-cache-key"),
			Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: 24 * time.Hour, Max: 1 << 30}}},
	}
	owner := ledger.NewOwner()
	w := reserveReq(sc, held(1), owner)
	_, err := l.Reserve(ctx, w) // registers the partition before the pauses
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx, w.Ref, owner))
	keyOf := func(s ledger.Scope) string { return "sluice:{" + sc[0].Key.String() + "}:s:" + s.Key.String() }
	overrun := "o:" + strconv.Itoa(int(ledger.Tokens))
	var committed, over int64 // what the rounds so far charged
	round := func(name string) {
		const n = 24
		reqs := make([]ledger.ReserveRequest, n)
		errs := make([]error, n)
		pauseAndQueue(t, srv, 300*time.Millisecond, n, func(i int) {
			reqs[i] = reserveReq(sc, held(10), owner)
			reqs[i].Dispatch = true
			_, errs[i] = l.Reserve(ctx, reqs[i])
		})
		for i, err := range errs {
			require.NoError(t, err, "%s: reserve %d", name, i)
		}
		u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
		require.NoError(t, err)
		assert.Equal(t, int64(10*n), u.Reserved[ledger.Tokens], "%s: every hold once", name)
		assert.Equal(t, int64(n), u.SlotsInUse, "%s: every slot once", name)
		pauseAndQueue(t, srv, 300*time.Millisecond, n, func(i int) {
			actual := held(7)
			if i%2 == 1 {
				actual = held(12) // 2 tokens past the hold
			}
			_, errs[i] = l.Settle(ctx, reqs[i].Ref, actual, ledger.SourceFinal)
		})
		for i, err := range errs {
			require.NoError(t, err, "%s: settle %d", name, i)
		}
		committed += n / 2 * (7 + 12)
		over += n / 2 * 2
		for _, s := range sc {
			u, err := l.Snapshot(ctx, sc[0].Key, s.Key)
			require.NoError(t, err)
			assert.Zero(t, u.Reserved[ledger.Tokens], "%s: every hold released", name)
			assert.Zero(t, u.SlotsInUse, "%s: every slot freed", name)
			assert.Equal(t, committed, u.Limits[0].Committed, "%s: every actual charged once", name)
			o, err := rc.HGet(ctx, keyOf(s), overrun).Int64()
			require.NoError(t, err)
			assert.Equal(t, over, o, "%s: every overrun once", name)
		}
	}
	fc, es, ro := commandCalls(t, rc, "fcall"), commandCalls(t, rc, "evalsha"), commandCalls(t, rc, "fcall_ro")
	round("library")
	assert.Greater(t, commandCalls(t, rc, "fcall"), fc, "batches ran as FCALL")
	assert.Greater(t, commandCalls(t, rc, "fcall_ro"), ro, "snapshots ran as FCALL_RO")
	require.NoError(t, rc.FunctionFlush(ctx).Err())
	// A reader first: it loads the library again.
	u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	assert.Equal(t, committed, u.Limits[0].Committed, "a snapshot after FUNCTION FLUSH")
	round("after FUNCTION FLUSH")
	redisledger.UseBatchScript(l)
	fc = commandCalls(t, rc, "fcall")
	round("batch script")
	assert.Equal(t, fc, commandCalls(t, rc, "fcall"), "no FCALL once the batch script is chosen")
	assert.Greater(t, commandCalls(t, rc, "evalsha"), es, "batches ran as EVALSHA")
}

// TestGlobalOneOperation: on one server a Reserve with a global scope is one
// batch operation, and so is its Settle when the Ledger that reserved it
// settles it (the hold's settle rides along); another Ledger, which does
// not know the record's scopes, settles stepwise. Either way the tenant and
// the global counters end exact.
func TestGlobalOneOperation(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.Registerer = reg })
	other := newLedger(t, srv.Addr(), nil)
	gkey := testKeyer.GlobalKey()
	sc := []ledger.Scope{
		tenantScope("global-one-op", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30}),
		{Kind: ledger.KindGlobal, Key: gkey, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40}}},
	}
	owner := ledger.NewOwner()
	w := reserveReq(sc, held(1), owner)
	_, err := l.Reserve(ctx, w) // registers both partitions
	require.NoError(t, err)
	_, err = l.Settle(ctx, w.Ref, held(1), ledger.SourceFinal)
	require.NoError(t, err)
	g0, err := l.Snapshot(ctx, gkey, gkey)
	require.NoError(t, err)
	ops := func() float64 { _, sum := histCount(t, reg, "sluice_ledger_redis_batch_ops"); return sum }

	a := reserveReq(sc, held(100), owner)
	before := ops()
	_, err = l.Reserve(ctx, a)
	require.NoError(t, err)
	assert.InDelta(t, before+1, ops(), 1e-9, "the global Reserve is one operation")
	before = ops()
	s, err := l.Settle(ctx, a.Ref, held(60), ledger.SourceFinal)
	require.NoError(t, err)
	assert.False(t, s.Replayed)
	assert.InDelta(t, before+1, ops(), 1e-9, "its Settle, with the hold's, is one operation")

	b := reserveReq(sc, held(50), owner)
	_, err = l.Reserve(ctx, b)
	require.NoError(t, err)
	_, err = other.Settle(ctx, b.Ref, held(70), ledger.SourceFinal) // stepwise: other has no spec cached
	require.NoError(t, err)
	s, err = l.Settle(ctx, a.Ref, held(60), ledger.SourceFinal) // a replay settles nothing again
	require.NoError(t, err)
	assert.True(t, s.Replayed)

	gu, err := l.Snapshot(ctx, gkey, gkey)
	require.NoError(t, err)
	assert.Zero(t, gu.Reserved[ledger.Tokens], "every global hold settled")
	assert.Equal(t, g0.Limits[0].Committed+60+70, gu.Limits[0].Committed, "global charged once per Settle")
	tu, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	assert.Zero(t, tu.Reserved[ledger.Tokens])
	assert.Equal(t, int64(1+60+70), tu.Limits[0].Committed)
}

// TestBatchWithoutFunctions: a user whose ACL refuses FCALL and FUNCTION
// still gets every batch run, through the batch script (EVALSHA), and the
// counters are exact.
func TestBatchWithoutFunctions(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, rc.Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err())
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.Username, c.Password = "nofn", "pw" })
	require.NoError(t, l.LoadScripts(ctx))
	sc := []ledger.Scope{tenantScope("no-functions", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30})}
	owner := ledger.NewOwner()
	es := commandCalls(t, rc, "evalsha")
	for range 3 {
		r := reserveReq(sc, held(10), owner)
		_, err := l.Reserve(ctx, r)
		require.NoError(t, err)
		_, err = l.Settle(ctx, r.Ref, held(4), ledger.SourceFinal)
		require.NoError(t, err)
	}
	u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	assert.Zero(t, u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(12), u.Limits[0].Committed)
	assert.GreaterOrEqual(t, commandCalls(t, rc, "evalsha")-es, int64(6), "every operation ran as EVALSHA")
}

// TestBatchPooledOpsKeepTheirReplies: operations are pooled and reused, so
// one whose caller gave up (queued, or in a call in flight) must never be
// completed into a later caller's operation. Concurrent Extends, each with
// its own TTL, run through shared calls behind a proxy that delays every
// reply, and a third of the callers time out at staggered moments: while
// queued or while their call is in flight. Ledger time is pinned, so every
// success must return exactly its own now + TTL; a reply of another
// operation would be off (and the race detector sees a reused op written).
func TestBatchPooledOpsKeepTheirReplies(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli() // ahead of TIME: every script's now
	setup := newLedger(t, srv.Addr(), nil)
	redisledger.SetTimeFloor(setup, func() int64 { return now })
	proxy := startDelayProxy(t, srv.Addr(), 40*time.Millisecond)
	l := newLedger(t, proxy.Addr(), func(c *redisledger.Config) { c.StoreTimeout = 2 * time.Second; c.MaxBatch = 4 })
	redisledger.SetTimeFloor(l, func() int64 { return now })
	require.NoError(t, l.LoadScripts(ctx))
	sc := []ledger.Scope{tenantScope("batch-pool", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30})}
	owner := ledger.NewOwner()
	const n, rounds = 24, 12
	refs := make([]ledger.Ref, n)
	for i := range refs {
		req := reserveReq(sc, held(1), owner)
		req.LeaseTTL = time.Second
		_, err := setup.Reserve(ctx, req)
		require.NoError(t, err)
		refs[i] = req.Ref
	}
	// ttl grows with every call, so an Extend never meets a longer lease
	// (which it would keep) left by an earlier, abandoned one.
	ttl := func(r, i int) time.Duration { return 2*time.Second + time.Duration(r*n+i+1)*time.Millisecond }
	var unavailable, ambiguous int
	for r := range rounds {
		exp := make([]time.Time, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				cctx := ctx
				if i%3 == 0 {
					var cancel context.CancelFunc
					cctx, cancel = context.WithTimeout(ctx, time.Duration(20+(i/3%4)*25)*time.Millisecond)
					defer cancel()
				}
				exp[i], errs[i] = l.Extend(cctx, refs[i], owner, ttl(r, i))
			})
		}
		wg.Wait()
		for i := range n {
			switch {
			case errs[i] == nil:
				assert.Equal(t, now+ttl(r, i).Milliseconds(), exp[i].UnixMilli(), "round %d op %d: its own reply", r, i)
			case i%3 == 0 && errors.Is(errs[i], ledger.ErrUnavailable):
				unavailable++
			case i%3 == 0 && errors.Is(errs[i], ledger.ErrAmbiguous):
				ambiguous++
			default:
				t.Errorf("round %d op %d: %v", r, i, errs[i])
			}
		}
	}
	t.Logf("gave up: %d queued, %d in flight", unavailable, ambiguous)
	assert.Positive(t, unavailable, "callers that gave up while queued")
	assert.Positive(t, ambiguous, "callers that gave up while their call was in flight")
	// Whatever the abandoned operations did, each record now answers its own call.
	for i, ref := range refs {
		d := ttl(rounds, i)
		e, err := l.Extend(ctx, ref, owner, d)
		require.NoError(t, err)
		assert.Equal(t, now+d.Milliseconds(), e.UnixMilli())
	}
}
