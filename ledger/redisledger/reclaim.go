package redisledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Reclaim expires due leases of one tenant (RESERVED → EXPIRED, DISPATCHED →
// UNRESOLVED) and charges UNRESOLVED records whose first admission window has
// closed, at most max ids of each kind per call. Each id is its own script,
// which rechecks due-ness, so Reclaim may lag but never acts early.
func (l *Ledger) Reclaim(ctx context.Context, tenant ledger.ScopeKey, limit int) (ledger.ReclaimStats, error) {
	var st ledger.ReclaimStats
	if tenant.IsZero() {
		return st, fmt.Errorf("zero tenant: %w", ledger.ErrInvalid)
	}
	if limit <= 0 {
		limit = l.cfg.ReclaimBatch
	}
	base := l.tenantBase(tenant)
	r, err := l.run(ctx, l.s.scan, true, []string{base + "m", base + "L", base + "U"}, limit)
	if err != nil {
		return st, err
	}
	if r.status() != "OK" || len(r) < 4 {
		return st, l.corrupt("reclaim scan")
	}
	due, _ := r[2].([]any)
	unres, _ := r[3].([]any)
	return l.reclaimIDs(ctx, tenant, due, unres, limit)
}

// reclaimIDs is Reclaim after its scan of tenant found the due leases due
// and the UNRESOLVED ids unres, at most limit of each.
func (l *Ledger) reclaimIDs(ctx context.Context, tenant ledger.ScopeKey, due, unres []any, limit int) (st ledger.ReclaimStats, err error) {
	st.More = len(due) >= limit || len(unres) >= limit
	defer func() {
		l.m.reclaimed.WithLabelValues("expired").Add(float64(st.Expired))
		l.m.reclaimed.WithLabelValues("unresolved").Add(float64(st.Unresolved))
		l.m.reclaimed.WithLabelValues("charged").Add(float64(st.Charged))
	}()
	for _, x := range due {
		ref, ok := refOf(tenant, x)
		if !ok {
			return st, l.corrupt("lease entry id")
		}
		rr, _, err := l.runRecord(ctx, l.s.expire, ref)
		if err != nil {
			return st, err
		}
		switch rr.status() {
		case "OK":
			s, _ := rr.int(2)
			_ = l.endHold(ctx, ref.ID, rr.str(5)) // (best effort: the owner's end of the request retries)
			if ledger.State(s) == ledger.Expired {
				st.Expired++
				l.forgetSpec(ref.ID)
				// Best effort: the global hold's own lease is the backstop.
				// An EXPIRED record was never sent, so its hold goes at zero
				// whatever its state (MarkDispatched may have dispatched it
				// before dying).
				_ = l.followGlobal(ctx, rr.str(5), func(g ledger.Ref) error {
					return l.globalSettle(ctx, g, ledger.Amounts{}, ledger.SourceNotSent)
				})
			} else {
				st.Unresolved++
				if l.followRequest(ctx, ref, rr.str(5)) {
					continue // a global hold, ended as its request ended
				}
				// Chargeable at once when its first admission window has closed.
				ra, _ := rr.int(3)
				now, _ := rr.int(4)
				if ra <= now {
					if _, err := l.resolve(ctx, ref, false); err == nil {
						st.Charged++
					} else if !errors.Is(err, errNotDue) {
						return st, err
					}
				}
			}
		case "NOTDUE":
		default:
			if err := l.statusErr(rr); err != nil {
				return st, err
			}
			return st, l.corrupt("unknown expire reply " + rr.status())
		}
	}
	for _, x := range unres {
		ref, ok := refOf(tenant, x)
		if !ok {
			return st, l.corrupt("unresolved entry id")
		}
		if l.followUnresolved(ctx, ref) {
			continue
		}
		_, err := l.resolve(ctx, ref, false)
		switch {
		case err == nil:
			st.Charged++
		case errors.Is(err, errNotDue), errors.Is(err, ledger.ErrAlreadyFinal), errors.Is(err, ledger.ErrNotFound):
		default:
			return st, err
		}
	}
	return st, nil
}

// Run reclaims every partition that may hold records (Config.Tenants, every
// tenant and global partition any instance has registered, and the global
// partitions this process reserved in) each ReclaimInterval until ctx ends,
// then returns nil. Store errors are counted and retried next tick. Call it
// once, inside the process's errgroup.
func (l *Ledger) Run(ctx context.Context) error {
	if l.cfg.ReclaimInterval <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(l.cfg.ReclaimInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		l.reclaimAll(ctx)
	}
}

// scanBatch is the most partitions one call of the scans function carries.
// Every instance scans every partition each tick, and nearly all of them
// are idle: alone, a scan costs Redis about 70 µs of CPU, most of it the
// call's own (reading the command, running the function, the reply), so
// a thousand partitions and ten instances kept 0.7 of a core busy finding
// nothing. In calls of 128 an idle partition costs about 4 µs
// (BenchmarkReclaimIdle; docs/benchmarks/log/2026-12-03-redis-ledger.md).
const scanBatch = 128

// reclaimAll is one tick of Run: every partition scanned, in calls of up to
// scanBatch partitions per server or Cluster node where the server has
// functions (one call each where it has not), and each partition with due
// ids reclaimed, up to 64 Reclaim passes of ReclaimBatch ids.
func (l *Ledger) reclaimAll(ctx context.Context) {
	start := time.Now()
	defer func() { l.m.reclaimPass.Observe(time.Since(start).Seconds()) }()
	l.registerPending(ctx)
	alone := l.partitions(ctx)
	if l.b != nil && l.scanBatch > 1 && !l.b.noFunc.Load() {
		alone = l.scanAll(ctx, alone)
	}
	for _, tenant := range alone {
		l.drain(ctx, tenant)
	}
}

// drain runs Reclaim passes on tenant while the last one left more.
func (l *Ledger) drain(ctx context.Context, tenant ledger.ScopeKey) {
	for range 64 { // bounded drain per tick
		st, err := l.Reclaim(ctx, tenant, l.cfg.ReclaimBatch)
		if err != nil || !st.More {
			return
		}
	}
}

// scanAll scans parts in batches (per node on a Cluster), reclaims what
// they find and returns the partitions left to scan alone: those a batch
// could not read (a slot moving, a damaged meta: the lone scan reports or
// follows it) and every partition of a batch that failed as a whole.
func (l *Ledger) scanAll(ctx context.Context, parts []ledger.ScopeKey) []ledger.ScopeKey {
	var alone []ledger.ScopeKey
	groups := map[any][]ledger.ScopeKey{}
	var order []any
	for _, p := range parts {
		var g any
		if cc := l.b.cc; cc != nil {
			n, err := cc.MasterForKey(ctx, l.tenantBase(p)+"m")
			if err != nil {
				alone = append(alone, p)
				continue
			}
			g = n
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], p)
	}
	if len(order) == 1 {
		return append(alone, l.scanGroup(ctx, groups[order[0]])...)
	}
	// One goroutine per Cluster node: each node scans its own partitions,
	// so a pass takes the longest node's time, not the sum.
	lefts := make([][]ledger.ScopeKey, len(order))
	var wg sync.WaitGroup
	for i, g := range order {
		wg.Go(func() { lefts[i] = l.scanGroup(ctx, groups[g]) })
	}
	wg.Wait()
	for _, left := range lefts {
		alone = append(alone, left...)
	}
	return alone
}

// scanGroup scans ps, partitions of one server or one Cluster node, in
// batches of scanBatch, one after another, reclaiming what they find; it
// returns those left to scan alone.
func (l *Ledger) scanGroup(ctx context.Context, ps []ledger.ScopeKey) (alone []ledger.ScopeKey) {
	for len(ps) > 0 && ctx.Err() == nil {
		chunk := ps[:min(len(ps), l.scanBatch)]
		ps = ps[len(chunk):]
		hits, rest, err := l.scanChunk(ctx, chunk)
		if err != nil {
			alone = append(alone, chunk...)
			continue
		}
		alone = append(alone, rest...)
		for _, h := range hits {
			st, err := l.reclaimIDs(ctx, h.tenant, h.due, h.unres, l.cfg.ReclaimBatch)
			if err == nil && st.More {
				l.drain(ctx, h.tenant)
			}
		}
	}
	return alone
}

// scanHit is a partition whose batched scan found due ids.
type scanHit struct {
	tenant     ledger.ScopeKey
	due, unres []any
}

// scanChunk scans the partitions of chunk (one server, or one Cluster node)
// in one FCALL_RO of the scans function: the partitions with due ids, those
// it could not read (rest), or an error for the whole call.
func (l *Ledger) scanChunk(ctx context.Context, chunk []ledger.ScopeKey) (hits []scanHit, rest []ledger.ScopeKey, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	base := l.tenantBase(chunk[0])
	keys := []string{base + "m", base + "L", base + "U"}
	args := make([]any, 0, 3+3*len(chunk))
	args = append(args, l.cfg.ReclaimBatch, len(chunk)-1)
	for _, p := range chunk[1:] {
		b := l.tenantBase(p)
		args = append(args, b+"m", b+"L", b+"U")
	}
	var fl int64
	if l.floor != nil {
		fl = l.floor()
	}
	args = append(args, fl)
	cmd := l.c.FCallRO(ctx, l.s.scans, keys, args...)
	if funcMissing(cmd.Err()) {
		if err := l.loadLibrary(ctx); err == nil {
			cmd = l.c.FCallRO(ctx, l.s.scans, keys, args...)
		}
	}
	v, err := cmd.Result()
	if err != nil {
		if funcUnsupported(err) {
			l.b.noFunc.Store(true)
		}
		return nil, nil, l.storeErr(err)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 || arr[0] != "OK" {
		return nil, nil, l.corrupt("unexpected scans reply")
	}
	for _, x := range arr[1:] {
		e, _ := x.([]any)
		var i int64
		if len(e) > 0 {
			i, _ = e[0].(int64)
		}
		if i < 1 || int(i) > len(chunk) {
			return nil, nil, l.corrupt("scans entry")
		}
		p := chunk[i-1]
		if len(e) < 4 {
			rest = append(rest, p) // CORRUPT or ERR: the lone scan says why
			continue
		}
		due, _ := e[2].([]any)
		unres, _ := e[3].([]any)
		hits = append(hits, scanHit{tenant: p, due: due, unres: unres})
	}
	return hits, rest, nil
}

// followUnresolved is followRequest for an UNRESOLVED record found due for
// its charge: a global hold its Reclaim could not end when it expired (the
// request's record unreadable then, or the hold expired by a process of an
// earlier version).
func (l *Ledger) followUnresolved(ctx context.Context, ref ledger.Ref) bool {
	rec, ok := l.peekRecord(ctx, ref)
	if !ok || rec.str(0) != strconv.Itoa(int(ledger.Unresolved)) {
		return false
	}
	return l.followRequest(ctx, ref, rec.str(7))
}
