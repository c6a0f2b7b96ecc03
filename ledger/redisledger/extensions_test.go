package redisledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// TestGlobalOrphanHoldIsReclaimed: a global hold whose tenant record never
// came to be (a crash between the two steps, simulated by deleting the
// tenant's keys) is not leaked: its lease runs out and Reclaim of the global
// partition (which Run does for every global partition it has used) frees it.
// MaxBatch 1 runs the two-step protocol a Cluster runs (with batching, one
// server keeps the global scope in the tenant record: no hold, no orphan).
func TestGlobalOrphanHoldIsReclaimed(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	var now atomic.Int64
	now.Store(time.Now().Add(24 * time.Hour).UnixMilli())
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.MaxBatch = 1 })
	redisledger.SetTimeFloor(l, now.Load)
	ctx := t.Context()
	g := testKeyer.GlobalKey()
	sc := []ledger.Scope{tenantScope("orphan", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}),
		{Kind: ledger.KindGlobal, Key: g, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 100}}}}
	req := reserveReq(sc, held(60), ledger.NewOwner())
	req.LeaseTTL = time.Second
	_, err := l.Reserve(ctx, req)
	require.NoError(t, err)
	keys, err := rc.Keys(ctx, "sluice:{"+sc[0].Key.String()+"}:*").Result()
	require.NoError(t, err)
	require.NoError(t, rc.Del(ctx, keys...).Err())
	other := []ledger.Scope{tenantScope("orphan-2", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}), sc[1]}
	_, err = l.Reserve(ctx, reserveReq(other, held(60), ledger.NewOwner()))
	var de *ledger.DeniedError
	require.ErrorAs(t, err, &de, "the orphan still counts until its lease runs out")
	assert.Equal(t, ledger.KindGlobal, de.Scope)
	now.Add(1500)
	st, err := l.Reclaim(ctx, g, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Expired)
	u, err := l.Snapshot(ctx, g, g)
	require.NoError(t, err)
	assert.Equal(t, ledger.Amounts{}, u.Reserved, "the orphaned global hold is freed")
	_, err = l.Reserve(ctx, reserveReq(other, held(60), ledger.NewOwner()))
	require.NoError(t, err, "(another tenant: the deleted one is fenced as a store loss)")
}

// TestUsageEventsOfExtensions: a Charge emits one usage event (source
// outage, admitted at At), a replay none; the Settle event of a request with
// a global scope names that scope (as Memory's do).
func TestUsageEventsOfExtensions(t *testing.T) {
	srv := startRedis(t)
	var mu sync.Mutex
	var evs []ledger.UsageEvent
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) {
		c.OnUsage = func(ev ledger.UsageEvent) { mu.Lock(); evs = append(evs, ev); mu.Unlock() }
	})
	ctx := t.Context()
	g := testKeyer.GlobalKey()
	gs := ledger.Scope{Kind: ledger.KindGlobal, Key: g, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}}
	ts := tenantScope("events", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})
	at := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	c := ledger.ChargeRequest{Ref: ledger.Ref{Tenant: ts.Key, ID: ledger.NewRequestID()}, Scopes: []ledger.Scope{ts, gs},
		Amounts: held(9), At: at}
	_, err := l.Charge(ctx, c)
	require.NoError(t, err)
	s, err := l.Charge(ctx, c)
	require.NoError(t, err)
	require.True(t, s.Replayed)
	req := reserveReq([]ledger.Scope{ts, gs}, held(20), ledger.NewOwner())
	_, err = l.Reserve(ctx, req)
	require.NoError(t, err)
	_, err = l.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	ev := evs[0]
	assert.Equal(t, ledger.SourceOutage, ev.Source)
	assert.Equal(t, held(9), ev.Charged)
	assert.Equal(t, at.UnixMilli(), ev.AdmittedAt.UnixMilli())
	assert.Equal(t, 2, ev.NScopes)
	assert.Equal(t, 2, evs[1].NScopes)
	assert.Equal(t, ledger.ScopeRef{Kind: ledger.KindGlobal, Key: g}, evs[1].Scopes[1])
	u, err := l.Snapshot(ctx, g, g)
	require.NoError(t, err)
	require.Len(t, u.Limits, 1)
	assert.Equal(t, int64(14), u.Limits[0].Committed, "charge 9 + settle 5, each once")
}

// scriptFault fails script calls once armed, from the nth on: before they
// reach Redis (a process that died there), or, with lost, after they ran
// (the reply lost: ErrAmbiguous).
type scriptFault struct {
	commandHook
	armed atomic.Bool
	n     atomic.Int32 // calls still to let through, minus one
	lost  bool
}

func (f *scriptFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		script := strings.HasPrefix(name, "eval") || strings.HasPrefix(name, "fcall")
		if !f.armed.Load() || !script || f.n.Add(-1) >= 0 {
			return next(ctx, cmd)
		}
		err := errors.New("dead: the process stopped here")
		if f.lost {
			if err := next(ctx, cmd); err != nil {
				return err
			}
			err = fmt.Errorf("read tcp: i/o timeout (the reply was lost): %w", context.DeadlineExceeded)
		}
		cmd.SetErr(err)
		return err
	}
}

// twoStepPair is a global budget in two steps (MaxBatch 1, as on a
// Cluster) on one redis-server: a Ledger whose process dies where hook
// says, a peer that survives it, and the ledger time both run at (a day
// ahead, moved by the test), with one-second leases.
func twoStepPair(t *testing.T) twoStep {
	t.Helper()
	srv := startRedis(t)
	now := &atomic.Int64{}
	now.Store(time.Now().Add(24 * time.Hour).UnixMilli())
	hook := &scriptFault{}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	client.AddHook(hook)
	t.Cleanup(func() { _ = client.Close() })
	dying, err := redisledger.New(client, redisledger.Config{LeaseTTL: time.Second, StoreTimeout: 5 * time.Second, MaxBatch: 1})
	require.NoError(t, err)
	redisledger.SetTimeFloor(dying, now.Load)
	reg := prometheus.NewRegistry()
	peer := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.MaxBatch, c.Registerer = 1, reg })
	redisledger.SetTimeFloor(peer, now.Load)
	require.NoError(t, peer.LoadScripts(t.Context())) // one call per step: no NOSCRIPT fallback
	return twoStep{srv: srv, hook: hook, now: now, dying: dying, peer: peer, reg: reg}
}

// twoStep is what twoStepPair sets up (reg: the peer's metrics).
type twoStep struct {
	srv         *redisServer
	hook        *scriptFault
	now         *atomic.Int64
	dying, peer *redisledger.Ledger
	reg         *prometheus.Registry
}

// TestGlobalHoldFollowsDispatch: a process that dies between the two steps
// of MarkDispatched (a global budget in two steps, as on a Cluster) leaves
// the global scope holding and charging exactly what the tenant does, once
// every lease has run out and Reclaim has run (the global partition's first,
// then the tenant's: the less favourable order). Dispatching the tenant
// record first left it UNRESOLVED (held, and charged later) while its global
// hold expired uncharged.
func TestGlobalHoldFollowsDispatch(t *testing.T) {
	p := twoStepPair(t)
	hook, now, dying, peer := p.hook, p.now, p.dying, p.peer
	ctx := t.Context()
	g := testKeyer.GlobalKey()
	sc := []ledger.Scope{tenantScope("dies-dispatching", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}),
		{Kind: ledger.KindGlobal, Key: g, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}}}
	req := reserveReq(sc, held(60), ledger.NewOwner())
	req.LeaseTTL = time.Second
	_, err := dying.Reserve(ctx, req)
	require.NoError(t, err)
	hook.n.Store(1)
	hook.armed.Store(true)
	require.Error(t, dying.MarkDispatched(ctx, req.Ref, req.Owner), "the process dies after one step")

	now.Add(1500)
	for _, part := range []ledger.ScopeKey{g, sc[0].Key} {
		_, err := peer.Reclaim(ctx, part, 10)
		require.NoError(t, err)
	}
	tu, err := peer.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	gu, err := peer.Snapshot(ctx, g, g)
	require.NoError(t, err)
	assert.Equal(t, tu.Reserved, gu.Reserved, "the global scope holds what the tenant holds")
	assert.Equal(t, tu.Limits[0].Committed, gu.Limits[0].Committed, "and is charged what the tenant is")
	assert.Equal(t, ledger.Amounts{}, gu.Reserved, "the request was never sent: nothing held")
	assert.Zero(t, gu.Limits[0].Committed)
}

// TestGlobalHoldOfRefusedDispatchIsReleased: MarkDispatched dispatches a
// global hold before its record, so a record whose step a full slot limit
// refuses has a dispatched hold; releasing the record frees that hold too.
func TestGlobalHoldOfRefusedDispatchIsReleased(t *testing.T) {
	srv := startRedis(t)
	l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.MaxBatch = 1 })
	ctx := t.Context()
	g := testKeyer.GlobalKey()
	sc := []ledger.Scope{tenantScope("one-slot", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000},
		ledger.Limit{Dim: ledger.Slots, Max: 1}),
		{Kind: ledger.KindGlobal, Key: g, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}}}
	owner := ledger.NewOwner()
	running := reserveReq(sc, held(40), owner)
	running.Dispatch = true
	_, err := l.Reserve(ctx, running)
	require.NoError(t, err)
	queued := reserveReq(sc, held(60), owner)
	_, err = l.Reserve(ctx, queued)
	require.NoError(t, err)
	var de *ledger.DeniedError
	require.ErrorAs(t, l.MarkDispatched(ctx, queued.Ref, owner), &de, "the slot is taken")
	require.Equal(t, ledger.Slots, de.Dim)
	require.NoError(t, l.Release(ctx, queued.Ref, owner))

	tu, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	gu, err := l.Snapshot(ctx, g, g)
	require.NoError(t, err)
	assert.Equal(t, int64(40), tu.Reserved[ledger.Tokens])
	assert.Equal(t, tu.Reserved, gu.Reserved, "the global scope holds what the tenant holds: the running request")
}

// TestAmbiguousGlobalHoldIsReleased: a Reserve whose global step applied
// but whose reply was lost (two steps, as on a Cluster) fails ambiguous and
// leaves a dispatched global hold that no tenant record names. Ending the
// request (the Release the scheduler queues for an ambiguous Reserve, or the
// Charge of an outage admission) releases that hold, so the global scope
// holds nothing and is charged once; before, the hold waited for its lease
// and was then charged at its amount.
func TestAmbiguousGlobalHoldIsReleased(t *testing.T) {
	for _, end := range []string{"release", "charge"} {
		t.Run(end, func(t *testing.T) {
			srv := startRedis(t)
			hook := &scriptFault{lost: true}
			client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			client.AddHook(hook)
			t.Cleanup(func() { _ = client.Close() })
			l, err := redisledger.New(client, redisledger.Config{LeaseTTL: 10 * time.Second, StoreTimeout: 5 * time.Second, MaxBatch: 1})
			require.NoError(t, err)
			ctx := t.Context()
			require.NoError(t, l.LoadScripts(ctx))
			g := testKeyer.GlobalKey()
			sc := []ledger.Scope{tenantScope("ambiguous-"+end, ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}),
				{Kind: ledger.KindGlobal, Key: g, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}}}
			req := reserveReq(sc, held(60), ledger.NewOwner())
			req.Dispatch = true
			hook.n.Store(1) // the tenant side's check passes; the global step's reply is lost
			hook.armed.Store(true)
			_, err = l.Reserve(ctx, req)
			require.ErrorIs(t, err, ledger.ErrAmbiguous)
			hook.armed.Store(false)
			gu, err := l.Snapshot(ctx, g, g)
			require.NoError(t, err)
			require.Equal(t, int64(60), gu.Reserved[ledger.Tokens], "the global step applied")

			want := int64(0)
			if end == "release" {
				require.NoError(t, l.Release(ctx, req.Ref, req.Owner))
			} else {
				a := held(45)
				_, err := l.Charge(ctx, ledger.ChargeRequest{Ref: req.Ref, Scopes: sc, Amounts: a, At: time.Now()})
				require.NoError(t, err)
				want = 45
			}
			gu, err = l.Snapshot(ctx, g, g)
			require.NoError(t, err)
			assert.Equal(t, ledger.Amounts{}, gu.Reserved, "the orphaned hold is released")
			assert.Equal(t, want, gu.Limits[0].Committed, "and the global scope is charged once")
		})
	}
}

// TestGlobalHoldFollowsItsRequestAfterACrash: a process that dies between
// the end of a request and the end of its global hold (a global budget in
// two steps, as on a Cluster) leaves the hold to its lease. Reclaim then
// reads the request's record, named in the hold's, and ends the hold as the
// request ended: settled for the request's actual, not charged its whole
// hold once its window closes (the global scope charged 60 where the tenant
// was charged 25). A hold that went UNRESOLVED while its request was still
// open is settled the same way when its charge falls due.
func TestGlobalHoldFollowsItsRequestAfterACrash(t *testing.T) {
	for _, when := range []string{"at expiry", "at charge"} {
		t.Run(when, func(t *testing.T) {
			p := twoStepPair(t)
			srv, hook, now, dying, peer := p.srv, p.hook, p.now, p.dying, p.peer
			ctx := t.Context()
			g := testKeyer.GlobalKey()
			sc := []ledger.Scope{tenantScope("dies-settling", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}),
				{Kind: ledger.KindGlobal, Key: g, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}}}}
			req := reserveReq(sc, held(60), ledger.NewOwner())
			req.LeaseTTL, req.Dispatch = time.Second, true
			_, err := dying.Reserve(ctx, req)
			require.NoError(t, err)
			now.Add(1500) // every lease has run out
			if when == "at charge" {
				_, err = peer.Reclaim(ctx, g, 10) // the request is still open: the hold waits
				require.NoError(t, err)
			}
			holds, err := peer.List(ctx, g, ledger.Unresolved, 0)
			require.NoError(t, err)
			hook.n.Store(1) // the tenant step, then the process dies
			hook.armed.Store(true)
			_, err = dying.Settle(ctx, req.Ref, held(25), ledger.SourceFinal)
			require.Error(t, err, "the process dies after one step")

			if when == "at charge" {
				require.Len(t, holds, 1)
				now.Add(2 * time.Hour.Milliseconds()) // its window has closed
			}
			_, err = peer.Reclaim(ctx, g, 10)
			require.NoError(t, err)
			assert.InDelta(t, 1.0, metricValue(t, p.reg, "sluice_ledger_redis_reclaimed_total", "followed"), 1e-9)
			if when == "at charge" {
				f, err := recordFields(ctx, srv.Client(t), "sluice:{"+g.String()+"}:q:"+ledger.ScopeKey(holds[0].Ref.ID).String())
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprint(int(ledger.Settled)), f["st"], "settled, not charged its hold")
				assert.Empty(t, f["g"], "its tombstone keeps no request")
				assert.True(t, strings.HasPrefix(f["a"], "1,25,0,25,"), "for the request's actual (requests, input, output, tokens...): %s", f["a"])
				return
			}
			gu, err := peer.Snapshot(ctx, g, g)
			require.NoError(t, err)
			tu, err := peer.Snapshot(ctx, sc[0].Key, sc[0].Key)
			require.NoError(t, err)
			assert.Equal(t, ledger.Amounts{}, gu.Reserved, "nothing held")
			assert.Equal(t, int64(25), tu.Limits[0].Committed)
			assert.Equal(t, int64(25), gu.Limits[0].Committed, "the global scope is charged what the tenant is")
		})
	}
}
