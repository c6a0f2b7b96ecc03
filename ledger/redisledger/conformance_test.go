package redisledger_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/ledgertest"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// TestConformance runs the shared suite (ledger/ledgertest) against the Redis
// backend on a real redis-server. Ledger time is pinned with a clock floor a
// day ahead of the server's TIME; Advance raises it for every tenant.
func TestConformance(t *testing.T) { conformance(t, 0, false) }

// TestConformanceUnbatched runs the suite with every operation its own
// script (Config.MaxBatch 1), the path before batching.
func TestConformanceUnbatched(t *testing.T) {
	if testing.Short() {
		t.Skip("the batched suite covers the same scripts")
	}
	conformance(t, 1, false)
}

// TestConformanceBatchScript runs the suite batched through the batch
// script (EVALSHA), as on a server without functions, instead of the
// function library.
func TestConformanceBatchScript(t *testing.T) {
	if testing.Short() {
		t.Skip("the batched suite covers the same operations")
	}
	conformance(t, 0, true)
}

// TestConformanceCluster runs the suite on a real three-node Redis Cluster:
// batches grouped by slot, a global scope's two-step hold on another node,
// the function library on every primary.
func TestConformanceCluster(t *testing.T) {
	c := startCluster(t, 3)
	// The model's state machine is the same scripts as on one server (1,000
	// sequences there); here it checks the routing, in fewer.
	conformanceOn(t, c.Addrs(), c.Client(t), 0, false, 200)
}

func conformance(t *testing.T, maxBatch int, batchScript bool) {
	srv := startRedis(t)
	conformanceOn(t, []string{srv.Addr()}, srv.Client(t), maxBatch, batchScript, 1000)
}

// conformanceOn runs the suite on the store at addrs (one address: a
// standalone server; several: a Cluster), rc a client of it, with seqs
// model-based sequences.
func conformanceOn(t *testing.T, addrs []string, rc redis.UniversalClient, maxBatch int, batchScript bool, seqs int) {
	var once sync.Once
	ledgertest.Run(t, func(t *testing.T, cfg ledgertest.Config) *ledgertest.Backend {
		l := newLedgerAt(t, addrs, func(c *redisledger.Config) {
			c.LeaseTTL, c.MaxLeaseTTL, c.TombstoneRetention = cfg.LeaseTTL, cfg.MaxLeaseTTL, cfg.TombstoneRetention
			c.StoreTimeout = 10 * time.Second // semantics, not latency: T6 runs 1000 calls at once on 2 shared cores
			c.MaxBatch = maxBatch
		})
		once.Do(func() { require.NoError(t, l.LoadScripts(context.Background())) })
		var now atomic.Int64
		now.Store(time.Now().Add(24 * time.Hour).UnixMilli())
		redisledger.SetTimeFloor(l, now.Load)
		// A second front end with its own client and pool on the same store.
		peer := newLedgerAt(t, addrs, func(c *redisledger.Config) {
			c.LeaseTTL, c.MaxLeaseTTL, c.TombstoneRetention = cfg.LeaseTTL, cfg.MaxLeaseTTL, cfg.TombstoneRetention
			c.StoreTimeout = 10 * time.Second
			c.MaxBatch = maxBatch
		})
		redisledger.SetTimeFloor(peer, now.Load)
		if batchScript {
			redisledger.UseBatchScript(l)
			redisledger.UseBatchScript(peer)
		}
		return &ledgertest.Backend{
			Ledger:  l,
			Now:     func() time.Time { return time.UnixMilli(now.Load()) },
			Advance: func(d time.Duration) { now.Add(d.Milliseconds()) },
			Audit:   func(tenant ledger.ScopeKey) error { return audit(rc, tenant) },
			Dump: func(tenant ledger.ScopeKey) string {
				d := dumpTenant(t, rc, tenant)
				var b strings.Builder
				for _, k := range sortedKeys(d) {
					fmt.Fprintf(&b, "%s=%x\n", k, d[k])
				}
				return b.String()
			},
			Corrupt: func(kind ledgertest.Corruption, ref ledger.Ref, scope ledger.ScopeKey) error {
				ctx := context.Background()
				base := "sluice:{" + ref.Tenant.String() + "}:"
				id := ledger.ScopeKey(ref.ID).String()
				switch kind {
				case ledgertest.NegativeReserved:
					return rc.HSet(ctx, base+"s:"+scope.String(), "r:3", "-5").Err()
				case ledgertest.UnknownState:
					return setRecordField(ctx, rc, base+"q:"+id, "st", "99")
				case ledgertest.LeaseWithoutRecord:
					return rc.Del(ctx, base+"q:"+id).Err()
				}
				return fmt.Errorf("unknown corruption %d", kind)
			},
			Orphans:        func() int { return int(l.Orphans()) },
			Peers:          []ledger.Ledger{peer},
			ModelSequences: seqs,
		}
	})
}

// audit recomputes I5 for one partition from the open records (the members
// of every partition's L and U: a global scope kept inline is held by other
// tenants' records): r per scope and dimension is Σ held of open records, n
// is the number of DISPATCHED records holding a slot, L holds exactly the
// RESERVED/DISPATCHED records and U the UNRESOLVED ones. c is checked by the
// model (T16) and the exact-count tests, not here.
func audit(rc redis.UniversalClient, tenant ledger.ScopeKey) error {
	ctx := context.Background()
	base := "sluice:{" + tenant.String() + "}:"
	type sums struct {
		r    [ledger.NumDims]int64
		n    int64
		slot bool
	}
	want := map[string]*sums{}
	// check sums the open records of the partition pbase into want; only
	// this partition's are validated (another test may have damaged
	// another partition on purpose).
	check := func(pbase, zset string, states ...string) error {
		ids, err := rc.ZRange(ctx, pbase+zset, 0, -1).Result()
		if err != nil {
			return err
		}
		own := pbase == base
		for _, id := range ids {
			rec, err := recordFields(ctx, rc, pbase+"q:"+id)
			if err != nil && !own {
				continue
			}
			if err != nil {
				return err
			}
			ok := false
			for _, s := range states {
				ok = ok || rec["st"] == s
			}
			switch {
			case !own && (len(rec) == 0 || !ok):
				continue
			case len(rec) == 0:
				return fmt.Errorf("%s entry %s without record", zset, id)
			case !ok:
				return fmt.Errorf("%s entry %s in state %s", zset, id, rec["st"])
			}
			var held [ledger.NumDims]int64
			for i, f := range strings.Split(rec["h"], ",") {
				if i < len(held) {
					fmt.Sscan(f, &held[i])
				}
			}
			for part := range strings.SplitSeq(rec["sp"], ";") {
				name, lims, _ := strings.Cut(part, "/")
				key := pbase + "s:" + name[1:]
				if strings.Contains(lims, ":B") || strings.Contains(lims, ":W") { // inline global
					key = "sluice:{" + name[1:] + "}:s:" + name[1:]
				}
				if !strings.HasPrefix(key, base) {
					continue
				}
				s := want[key]
				if s == nil {
					s = &sums{}
					want[key] = s
				}
				for d := range s.r {
					s.r[d] += held[d]
				}
				if strings.Contains(","+lims, ","+fmt.Sprint(int(ledger.Slots))+":0:") {
					s.slot = true
					if rec["st"] == "2" && rec["sl"] == "1" {
						s.n++
					}
				}
			}
		}
		return nil
	}
	// A global partition's hash is also held by other tenants' records (an
	// inline global scope), so its audit reads every partition's open
	// records; a tenant's reads its own.
	others := func(zset string) ([]string, error) {
		lim, err := rc.HGet(ctx, base+"s:"+tenant.String(), "lim").Result()
		if err == redis.Nil || (err == nil && !strings.HasPrefix(lim, "4")) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		keys, err := rc.Keys(ctx, "sluice:{*}:"+zset).Result()
		var out []string
		for _, k := range keys {
			if pb := strings.TrimSuffix(k, zset); pb != base {
				out = append(out, pb)
			}
		}
		return out, err
	}
	for _, z := range []struct {
		zset   string
		states []string
	}{{"L", []string{"1", "2"}}, {"U", []string{"6"}}} {
		pbs, err := others(z.zset)
		if err != nil {
			return err
		}
		for _, pb := range append([]string{base}, pbs...) {
			if err := check(pb, z.zset, z.states...); err != nil {
				return err
			}
		}
	}
	// The scopes of open records, and the tenant scope, must match (a scope
	// absent from want must hold nothing). Scopes without open records are
	// covered by the model's own Snapshot comparison; scanning the keyspace
	// after every model step would dominate the suite's run time.
	keys := []string{base + "s:" + tenant.String()}
	for k := range want {
		if k != keys[0] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys[1:])
	for _, k := range keys {
		h, err := rc.HGetAll(ctx, k).Result()
		if err != nil {
			return err
		}
		w := want[k]
		if w == nil {
			w = &sums{}
		}
		for d := range w.r {
			if !ledger.Dim(d).Windowed() {
				continue
			}
			got := int64(0)
			fmt.Sscan(h[fmt.Sprintf("r:%d", d)], &got)
			if got != w.r[d] {
				return fmt.Errorf("%s r:%s = %d, open records hold %d", k, ledger.Dim(d), got, w.r[d])
			}
		}
		got := int64(0)
		fmt.Sscan(h["n"], &got)
		if got != w.n {
			return fmt.Errorf("%s n = %d, %d dispatched records", k, got, w.n)
		}
	}
	return nil
}
