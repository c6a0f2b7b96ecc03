package redisledger_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/promsum"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// reclaimWorld is n partitions, each left by a crashed instance with one
// record: i%3 == 0 a RESERVED hold, 1 a DISPATCHED one, 2 a settled
// request (an idle partition). Every lease is due two hours later.
type reclaimWorld struct {
	scopes [][]ledger.Scope
	refs   []ledger.Ref
}

func newReclaimWorld(t *testing.T, l *redisledger.Ledger, name string, n int) *reclaimWorld {
	t.Helper()
	ctx := t.Context()
	w := &reclaimWorld{}
	owner := ledger.NewOwner()
	for i := range n {
		sc := []ledger.Scope{tenantScope(fmt.Sprintf("%s-%d", name, i),
			ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30}, ledger.Limit{Dim: ledger.Slots, Max: 8})}
		req := reserveReq(sc, held(40), owner)
		req.Dispatch = i%3 != 0
		_, err := l.Reserve(ctx, req)
		require.NoError(t, err)
		if i%3 == 2 {
			_, err = l.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
			require.NoError(t, err)
		}
		w.scopes, w.refs = append(w.scopes, sc), append(w.refs, req.Ref)
	}
	return w
}

// check asserts every partition's record ended as one tick of Run must
// leave it: RESERVED → EXPIRED, DISPATCHED → UNRESOLVED → CHARGED (its
// admission window has closed), settled untouched, and nothing held. skip
// is a partition left as it was.
func (w *reclaimWorld) check(t *testing.T, l *redisledger.Ledger, rc redis.UniversalClient, skip int) {
	t.Helper()
	ctx := t.Context()
	want := []ledger.State{ledger.Expired, ledger.Charged, ledger.Settled}
	for i, ref := range w.refs {
		f, err := recordFields(ctx, rc, "sluice:{"+ref.Tenant.String()+"}:q:"+ledger.ScopeKey(ref.ID).String())
		require.NoError(t, err)
		st := want[i%3]
		if i == skip {
			st = []ledger.State{ledger.Reserved, ledger.Dispatched, ledger.Settled}[i%3]
		}
		require.Equal(t, fmt.Sprint(int(st)), f["st"], "partition %d", i)
		if i == skip {
			continue
		}
		u, err := l.Snapshot(ctx, ref.Tenant, ref.Tenant)
		require.NoError(t, err)
		require.Equal(t, ledger.Amounts{}, u.Reserved, "partition %d", i)
		require.Zero(t, u.SlotsInUse, "partition %d", i)
		require.Zero(t, u.Unresolved, "partition %d", i)
	}
}

// metricValue is the counter name{outcome=label}, or with label "" the
// observation count of the histogram name.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	var want map[string]string
	if label != "" {
		want = map[string]string{"outcome": label}
	}
	v, err := promsum.Sum(reg, name, want)
	require.NoError(t, err)
	return v
}

// TestReclaimAllScansInBatches: one tick of Run on 300 partitions left by a
// crashed instance reclaims every due record exactly, scanning them in
// three calls of the scans function, where scanning each alone takes 300;
// a partition whose meta is damaged is scanned alone (and reported
// corrupt) without holding up the others, and reclaimed once it is
// repaired.
func TestReclaimAllScansInBatches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch int
		scans int64 // FCALL_RO calls of the tick
		idle  int64 // and of the next one
	}{{"batched", 0, 3 + 1, 3}, {"alone", 1, 300, 300}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRedis(t)
			rc := srv.Client(t)
			ctx := t.Context()
			crashed := newLedger(t, srv.Addr(), nil)
			w := newReclaimWorld(t, crashed, "reclaim", 300)
			const damaged = 297 // a RESERVED one
			require.NoError(t, rc.HSet(ctx, metaKey(w.refs[damaged].Tenant), "hwm", "x").Err())

			reg := prometheus.NewRegistry()
			l := newLedger(t, srv.Addr(), func(c *redisledger.Config) { c.Registerer = reg })
			later := time.Now().Add(2 * time.Hour).UnixMilli()
			redisledger.SetTimeFloor(l, func() int64 { return later })
			if tc.batch > 0 {
				redisledger.SetScanBatch(l, tc.batch)
			}
			require.NoError(t, l.LoadScripts(ctx))
			require.NoError(t, rc.ConfigResetStat(ctx).Err())
			redisledger.ReclaimAll(ctx, l)
			assert.Equal(t, tc.scans, commandCalls(t, rc, "fcall_ro"), "scan calls")
			w.check(t, l, rc, damaged)
			assert.InDelta(t, 1, counterValue(t, reg, "sluice_ledger_corrupt_total"), 0, "the damaged meta, reported once")
			require.NoError(t, rc.HSet(ctx, metaKey(w.refs[damaged].Tenant), "hwm", "0").Err())
			redisledger.ReclaimAll(ctx, l) // repaired
			w.check(t, l, rc, -1)

			// A third tick finds nothing to do.
			require.NoError(t, rc.ConfigResetStat(ctx).Err())
			redisledger.ReclaimAll(ctx, l)
			assert.Equal(t, tc.idle, commandCalls(t, rc, "fcall_ro"), "scan calls, idle")
			assert.Zero(t, commandCalls(t, rc, "fcall"), "nothing written")
			w.check(t, l, rc, -1)
			for outcome, n := range map[string]float64{"expired": 100, "unresolved": 100, "charged": 100, "followed": 0} {
				assert.InDelta(t, n, metricValue(t, reg, "sluice_ledger_redis_reclaimed_total", outcome), 1e-9, outcome)
			}
			assert.InDelta(t, 3.0, metricValue(t, reg, "sluice_ledger_redis_reclaim_pass_seconds", ""), 1e-9, "passes")
		})
	}
}
