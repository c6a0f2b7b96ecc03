package fleet

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/peers"
)

// Splitting a shared replica's batch among instances (SCHEDULING §9).
// Without it an instance whose request completes refills the slot at once,
// while another instance sees the slot free only at its next scrape, by
// when it is taken again: the slots of a shared replica stay with the
// instances that hold them, however much the others have queued. So every
// instance of a Redis fleet reports, a few times a second, its requests in
// flight on each replica and what it has queued that the replica could
// serve, with the room its gates keep for light tenants' peaks, in total
// and by tenant (peers.Redis), and on a replica that others report too it
// takes at most its tenants' part of a weighted max-min fair split of
// max_num_seqs over every tenant at every instance (SeqShare): the batch
// goes by the tenants' weights, as on one instance, wherever each tenant
// sends. The cap limits only this instance's own requests: the batch
// estimate (the centre's sizing) still counts everything the replica runs.
//
// Handing slots over is not instant: an instance over its new share stops
// refilling, and the freed slot waits for the other's next scrape. Once
// the shares settle, each instance refills its own slots as before.

// PeerExchange is what the split needs of the fleet (peers.Redis).
type PeerExchange interface {
	ID() string
	Key(url string) string // the replica's name in the exchange
	Exchange(ctx context.Context, reports []peers.Report) (map[string][]peers.Entry, error)
	Leave(ctx context.Context) error
}

// ShareInterval is how often demand is exchanged.
const ShareInterval = 250 * time.Millisecond

// ShareStale bounds the age of the news shares are made from: reports
// older than this are not counted, and this instance's shares lapse (no
// cap) when its exchange has failed for as long.
const ShareStale = 2 * time.Second

// SeqShare is the most requests this instance (mine.Instance) may have in
// flight on a replica of maxSeqs sequences that other instances also use,
// from its own entry as it reported it and the others'. The batch is split
// by tenant, not by instance, the way the dispatch gate splits a pool on
// one instance (SCHEDULING §6, §9), over every tenant with demand there at
// any instance; a tenant at several instances is one claimant whose
// demand is the sum:
//
//   - A tenant is light when its averaged demand (Load) is within
//     gate.LightMargin times its weighted max-min fair share of the batch,
//     and no more than the whole batch; otherwise heavy.
//   - Light tenants are given what they claim now (held, queued and the
//     room kept for their peaks) plus, where a heavy tenant competes,
//     server.reserve_margin (default gate.BurstK) Poisson standard
//     deviations of their claims' sum (as the gate's reserve; SeqShare and
//     Split take the default); heavy tenants together keep one sequence of a
//     batch of two or more (of a pool of one replica: SplitPool). If the
//     light claims do not fit, they are split max-min by weight, and
//     while a light tenant at another instance has requests queued the
//     cap binds those given less than their claim (ShareOf.Heavy), as it
//     does one of them that this instance's gate lets through as no flood
//     with a standing queue (peers.TenantDemand.Stands) where its part
//     here is a request or more.
//   - Heavy tenants split what is left, max-min by weight over their
//     claims.
//
// A tenant's part goes to its instances in proportion to their claims. An
// entry without tenants (an older version's report) is one claimant of
// weight 1, its load what it has in flight and queued. Where no tenant is
// heavy the cap is 0, none, as the gate holds no light tenant back for
// another on one instance either, unless a tenant here is bound as cut
// (ShareOf.Heavy). This instance's share is its tenants'
// parts plus all that no tenant was given (the cap is what it may take if
// it wants more, so where the batch is not all claimed the caps may sum to
// more than maxSeqs; the batch estimate, the centre's sizing, still keeps
// the replica within it).
// Where it is all given, every instance computes the same integer shares
// from the same reports, summing to maxSeqs: each its part rounded down,
// the remainder one each to the largest fractions, then to the fewest
// requests in flight there, then by instance id. A claim counts at most
// maxSeqs. At least 1, so no instance starves when there are more
// instances than sequences (once per pool: FloorOnce); but
// NoSeqs, none, where its tenants are given nothing while a light tenant
// has requests queued (Queued) there.
func SeqShare(maxSeqs int64, mine peers.Entry, others []peers.Entry) int64 {
	return Split(maxSeqs, mine, others).Cap
}

// ShareOf is this instance's part of a shared replica's batch (Split).
type ShareOf struct {
	// Cap is the most requests of its heavy tenants' and of tenants it
	// did not report that the gate holds heavy (Replica.unshared) that it
	// may have in flight there (SeqShare); 0: no tenant anywhere is heavy
	// and none of its tenants is cut (Cut), so nothing is capped; NoSeqs:
	// none.
	Cap int64
	// Light is its tenants that the split holds light fleet-wide: the cap
	// does not bind them, as the gate's reserve does not bind a light
	// tenant on one instance (they compete for any room, and the heavy
	// tenants' caps leave their claims free).
	Light []string
	// Heavy is its tenants the cap binds: those the split holds heavy,
	// and those it holds light but gives less than their claim (the light
	// claims do not fit) while a light tenant at another instance has
	// requests queued there. On one instance the fair dequeue orders
	// light tenants whose claims do not fit; across instances the room a
	// completion frees goes to whichever instance sees it first, the one
	// that ran the request, so without the cap a light tenant asking near
	// the whole batch (a weight of 3 in 9 is light up to three times its
	// share) refilled every slot while one at the other instance waited
	// out its max_wait (fairgen seed 726 over 100 requests: 18 lost).
	// Bound whenever cut, a light tenant's Poisson cluster waited for the
	// split made before it came (9–24 more failing seeds of 500 a sweep).
	// A cut tenant its gate here lets through as no flood with a standing
	// queue (peers.TenantDemand.Stands) is bound whether or not one
	// waits elsewhere, where its part here is a request or more: on one
	// instance its weighted share bounds it once its queue has stood
	// (gate.Gate.Stands), but the reserve that holds it there keeps room
	// only for this instance's light tenants. Bound only while others
	// queued, a closed-loop flood refilled every slot between the light
	// tenants' queues at the other instance (the model's row of node's
	// TestLightTenantsAtAnotherInstance: their pooled p99 TTFT on the
	// median of 20 draws, 0.53 s → 0.23 s; in real processes, sent 20 s
	// or more into the run, p99 about 200 ms → 13 ms). A tenant starved
	// behind another reads as standing too; bound at a part below one
	// request, it started nothing (fairgen seeds 114, 1086, 1469 and 317
	// lost light requests).
	Heavy []string
	// Cut is the part of Heavy the split holds light, cut (the admin
	// API's seq_share_cut, traces, the model's ablation).
	Cut []string
	// Floor: Cap is the floor of one request that keeps an instance given
	// nothing from starving, not a part of the split (FloorOnce).
	Floor bool
}

// Split is SeqShare with the tenants it holds light.
func Split(maxSeqs int64, mine peers.Entry, others []peers.Entry) ShareOf {
	return SplitPool(maxSeqs, 1, DefaultReserve, mine, others)
}

// SplitPool is Split for a replica of a pool of replicas (Set.PoolOf).
// The heavy tenants' floor of one sequence is the pool's, as the dispatch
// gate on one instance lets heavy tenants keep one request in flight per
// pool, not per replica: on a pool of several replicas the split keeps
// none on each, and an instance its split gives
// nothing keeps one request on one replica of the pool (FloorOnce), or
// none while a light tenant waits (NoSeqs). Kept on every replica, the
// floor gave a flood's instance a sequence of each while the light
// tenants' instance waited for completions (on row x of the isolation
// rows, two replicas of 16, that is two slots where one instance keeps
// one; fairgen with two instances everywhere holds 5 more seeds of 500
// with one per pool).
func SplitPool(maxSeqs int64, replicas int, rs Reserve, mine peers.Entry, others []peers.Entry) ShareOf {
	if maxSeqs <= 0 {
		return ShareOf{Cap: 1}
	}
	self := mine.Instance
	sp := shareSplit{limit: float64(maxSeqs) * 1000, replicas: max(replicas, 1), margin: max(rs.Margin, 0),
		headroom: min(max(rs.Headroom, 0), 1), cap: min(max(rs.Cap, 0), 1)}
	for _, e := range append([]peers.Entry{mine}, others...) {
		if len(e.Tenants) == 0 {
			// An instance as one claimant: what it asks, uncapped, is its
			// load (a backlog past the batch is heavy).
			load := min(e.InFlight, 1<<40) + min(e.Queued, 1<<40)
			claim := min(load, maxSeqs)
			sp.add(e.Instance, "\x00instance "+e.Instance, 1, load*1000, claim*1000, 0, min(e.InFlight, maxSeqs)*1000, false)
			continue
		}
		for _, td := range e.Tenants {
			sp.add(e.Instance, td.Tenant, td.Weight, td.Load, td.Claim, td.Queued, td.Held, td.Steady)
		}
	}
	parts, capped, waiting := sp.split(self)
	var out ShareOf
	waitsElsewhere := sp.lightWaitsBeside(self)
	for _, td := range mine.Tenants {
		switch c := sp.byName[td.Tenant]; {
		case c == nil:
		case c.light && c.cut && (waitsElsewhere || (td.Stands && c.here >= 1000)):
			out.Heavy = append(out.Heavy, td.Tenant)
			out.Cut = append(out.Cut, td.Tenant)
		case c.light:
			out.Light = append(out.Light, td.Tenant)
		default:
			out.Heavy = append(out.Heavy, td.Tenant)
		}
	}
	if !capped && len(out.Cut) == 0 {
		// No tenant is heavy and none of this instance's is bound: no
		// cap. A tenant bound where no tenant is heavy is bound by this
		// instance's part all the same: reading the cap as none, a
		// closed-loop flood that its gate lets through as no flood, light
		// to the split, refilled every slot while light tenants at the
		// other instance waited (the model's row of node's
		// TestLightTenantsAtAnotherInstance, draw 1: p99 1.27 s → 0.34 s).
		return out
	}
	// Integer shares: thousandths rounded so that a sum's order cannot
	// move a tie between instances.
	ids := make([]string, 0, len(parts)+1)
	floor := int64(0)
	for id := range parts {
		ids = append(ids, id)
		floor += parts[id] / 1000
	}
	if _, ok := parts[self]; !ok {
		ids = append(ids, self)
	}
	// Equal fractions go first to the instance with fewer requests in
	// flight there: by id alone, the same instance took every tie, and on
	// a replica whose KV cache holds one request two light tenants cut to
	// half a sequence each were a whole one and none, at every exchange
	// (fairgen seed 486, with light tenants bound whenever cut: a variant
	// measured and not kept).
	inFlight := make(map[string]int64, len(others)+1)
	for _, e := range append([]peers.Entry{mine}, others...) {
		inFlight[e.Instance] += e.InFlight
	}
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(parts[b]%1000, parts[a]%1000), cmp.Compare(inFlight[a], inFlight[b]), cmp.Compare(a, b))
	})
	share := parts[self] / 1000
	if rank := int64(slices.Index(ids, self)); rank < maxSeqs-floor {
		share++
	}
	switch {
	case share > 0:
		out.Cap = share
	case waiting:
		// Its tenants are given nothing and a light tenant has a request
		// queued: as on one instance, where the heavy tenants' floor
		// yields to a light request waiting (gate.Gate.decide), this
		// instance may start none. A floor of one refills each slot it
		// frees before the waiting instance's next exchange sees it: on
		// replicas whose KV cache holds one request (a batch of one, where
		// the heavy tenants keep no sequence), a light tenant at the other
		// instance lost every request to its max_wait (fairgen seed 444
		// with two instances). On a lone replica whose batch is two or
		// more the heavy tenants' floor stays while light tenants wait: on
		// one replica, taking it too cost nothing in the model. On a pool of
		// several the split keeps no such floor (SplitPool).
		out.Cap = NoSeqs
	default:
		// No instance starves where there are more instances than
		// sequences; once per pool (FloorOnce).
		out.Cap, out.Floor = 1, true
	}
	return out
}

// FloorOnce keeps the floor of one request (ShareOf.Floor) in one
// instance's shares of a pool's replicas (nil where no other instance
// reports demand) on one replica at most, and on none where another of
// them gives it room (a part of the split, no cap, or no split): the
// others' floors become NoSeqs. This is the pool's floor of one request
// for heavy tenants (SplitPool), kept per instance: an instance whose
// heavy tenants are given nothing on every replica of the pool while no
// light tenant waits may start one.
func FloorOnce(shares []*ShareOf) {
	room := false
	for _, sh := range shares {
		room = room || sh == nil || !sh.Floor && sh.Cap >= 0
	}
	for _, sh := range shares {
		if sh == nil || !sh.Floor {
			continue
		}
		if room {
			sh.Cap = NoSeqs
		}
		room = true
	}
}

// NoSeqs is a cap of no requests (ShareOf.Cap, Replica.Share).
const NoSeqs = -1

// shareSplit is SeqShare's split, in thousandths of a request.
type shareSplit struct {
	limit    float64 // maxSeqs, in thousandths
	replicas int     // in the replica's pool
	margin   float64 // server.reserve_margin
	headroom float64 // server.headroom
	cap      float64 // server.reserve_cap
	claims   []*shareClaim
	byName   map[string]*shareClaim
}

// shareClaim is one tenant's demand on the replica at every instance.
type shareClaim struct {
	name   string
	weight float64
	load   float64 // averaged demand, summed over its instances
	claim  float64 // what it asks now, summed, at most limit
	want   float64 // what the split gives it if it fits: claim, and a light tenant's margin
	parts  []sharePart
	alloc  float64
	light  bool
	cut    bool    // light, given less than its claim: the light claims do not fit
	queued float64 // the part of claim queued, summed
	held   float64 // the part of claim holding room, summed
	noisy  float64 // the part of claim at instances whose gates do not read it steady
	here   float64 // its part at the splitting instance (split's self)
}

type sharePart struct {
	instance string
	claim    float64
	queued   float64
}

func (sp *shareSplit) add(instance, tenant string, weight, load, claim, queued, held int64, steady bool) {
	d := min(float64(max(claim, 0)), sp.limit)
	if d == 0 {
		return
	}
	if sp.byName == nil {
		sp.byName = map[string]*shareClaim{}
	}
	c := sp.byName[tenant]
	if c == nil {
		c = &shareClaim{name: tenant}
		sp.byName[tenant] = c
		sp.claims = append(sp.claims, c)
	}
	// Instances may briefly disagree on a weight (a reload reaching them
	// at different times): the largest counts, everywhere the same.
	c.weight = max(c.weight, float64(max(weight, 1)))
	c.load += float64(max(load, 0))
	c.claim = min(c.claim+d, sp.limit)
	c.queued += float64(max(queued, 0))
	c.held += min(float64(max(held, 0)), d)
	if !steady {
		c.noisy += d
	}
	c.parts = append(c.parts, sharePart{instance, d, float64(max(queued, 0))})
}

// split is each instance's part of the batch, in whole thousandths, with
// what no tenant was given added to self's; capped where a tenant is
// heavy, and waiting where then a light tenant has requests queued.
func (sp *shareSplit) split(self string) (parts map[string]int64, capped, waiting bool) {
	cs := sp.claims
	// One order everywhere, so that every instance sums alike.
	slices.SortFunc(cs, func(a, b *shareClaim) int { return cmp.Compare(a.name, b.name) })
	for _, c := range cs {
		c.load = min(c.load, 2*sp.limit) // past the batch it is heavy whatever its size
		c.want = c.claim
	}
	level := maxMin(cs, sp.limit, func(c *shareClaim) float64 { return c.load }, nil)
	var light, heavy []*shareClaim
	lightClaims, heavyClaims := 0.0, 0.0
	for _, c := range cs {
		if c.load <= gate.LightMargin*c.weight*level && c.load <= sp.limit {
			c.light = true
			light = append(light, c)
			lightClaims += c.claim
			waiting = waiting || c.queued > 0
		} else {
			heavy = append(heavy, c)
			heavyClaims += c.claim
		}
	}
	budget := sp.limit
	if len(heavy) > 0 && lightClaims > 0 {
		sp.reserveLight(light, lightClaims)
		if sp.limit >= 2000 {
			if sp.replicas == 1 {
				budget -= min(1000, heavyClaims) // the heavy tenants' floor: the pool's (SplitPool)
			}
		}
	}
	set := func(c *shareClaim, v float64) { c.alloc = v }
	maxMin(light, budget, func(c *shareClaim) float64 { return c.want }, set)
	left := sp.limit
	for _, c := range light {
		left -= c.alloc
	}
	maxMin(heavy, left, func(c *shareClaim) float64 { return c.want }, set)
	for _, c := range light {
		// Cut where the light claims do not fit, not where the operator's
		// cap on the reserve gives it less than it asks.
		c.cut = c.alloc < min(c.claim, c.want)-1e-6
	}
	f := map[string]float64{}
	given := 0.0
	for _, c := range cs {
		slices.SortFunc(c.parts, func(a, b sharePart) int { return cmp.Compare(a.instance, b.instance) })
		total := 0.0
		for _, p := range c.parts {
			total += p.claim
		}
		for _, p := range c.parts {
			part := c.alloc * p.claim / total
			f[p.instance] += part
			if p.instance == self {
				c.here += part
			}
		}
		given += c.alloc
	}
	f[self] += max(sp.limit-given, 0)
	out := make(map[string]int64, len(f))
	for id, v := range f {
		out[id] = int64(math.Round(v))
	}
	return out, len(heavy) > 0, waiting && len(heavy) > 0
}

// lightWaitsBeside reports whether a tenant the split holds light has
// requests queued at an instance other than self.
func (sp *shareSplit) lightWaitsBeside(self string) bool {
	for _, c := range sp.claims {
		if !c.light {
			continue
		}
		for _, p := range c.parts {
			if p.queued > 0 && p.instance != self {
				return true
			}
		}
	}
	return false
}

// maxMin is the weighted max-min fair split of budget among cs by what
// each asks: every claimant is given its ask or w·level, whichever is
// less, with level as high as budget allows. set (nil: none) receives
// each one's part; the level is returned, +Inf when every ask fits.
func maxMin(cs []*shareClaim, budget float64, ask func(*shareClaim) float64, set func(*shareClaim, float64)) float64 {
	order := slices.Clone(cs)
	slices.SortStableFunc(order, func(a, b *shareClaim) int { return cmp.Compare(ask(a)/a.weight, ask(b)/b.weight) })
	weights := 0.0
	for _, c := range order {
		weights += c.weight
	}
	budget = max(budget, 0)
	for i, c := range order {
		level := budget / weights
		if ask(c) > level*c.weight {
			// It and every claimant after it ask more than the level.
			if set != nil {
				for _, c := range order[i:] {
					set(c, level*c.weight)
				}
			}
			return level
		}
		if set != nil {
			set(c, ask(c))
		}
		budget -= ask(c)
		weights -= c.weight
	}
	return math.Inf(1)
}

// ShareDeps is what the share split needs of the centre.
type ShareDeps struct {
	// WaitingOn is this instance's demand beyond its requests in flight
	// that the replica in slot could serve: its queued requests, and the
	// room its gates keep for light tenants' demand peaks (gate.Pools),
	// which another instance's share must leave free too. It is reported
	// as Queued.
	WaitingOn func(slot int) int64
	// TenantsOn appends to out the same demand by tenant, held requests
	// included (gate.Pools.DemandOn, with the tenants' weights).
	TenantsOn func(slot int, out []peers.TenantDemand) []peers.TenantDemand
	// Wake lets queued work through: a share grew or lapsed.
	Wake func()
	// Reserve is server.reserve_margin and server.reserve_cap as of now
	// (they reload).
	Reserve func() Reserve
	Now     func() time.Time
	Log     *slog.Logger
}

// ShareLoop exchanges demand with the other instances every ShareInterval
// and sets each replica's share, until ctx ends; then it withdraws this
// instance's reports.
func ShareLoop(ctx context.Context, set *Set, ex PeerExchange, d ShareDeps) error {
	t := time.NewTicker(ShareInterval)
	defer t.Stop()
	// Each replica's name in the exchange, for the members as they are
	// (replicas join and leave: members.go).
	reps, keys := set.List(), []string(nil)
	rekey := func() {
		reps = set.List()
		keys = make([]string, len(reps))
		for i, r := range reps {
			keys[i] = ex.Key(r.URL)
		}
	}
	rekey()
	var lastOK time.Time
	failing := false
	for {
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := ex.Leave(lctx); err != nil {
				d.Log.Warn("withdrawing this instance's replica demand", "err", err)
			}
			if ApplyShares(ex.ID(), reps, keys, set.PoolOf, d.Reserve(), nil, nil) {
				d.Wake()
			}
			return nil
		case <-t.C:
		}
		if cur := set.List(); len(cur) != len(reps) || (len(cur) > 0 && &cur[0] != &reps[0]) {
			rekey()
		}
		xctx, cancel := context.WithTimeout(ctx, ShareStale/2)
		mine := DemandReports(reps, keys, d.WaitingOn, d.TenantsOn)
		got, err := ex.Exchange(xctx, mine)
		cancel()
		now := d.Now()
		wake := false
		switch {
		case got != nil:
			lastOK = now
			wake = ApplyShares(ex.ID(), reps, keys, set.PoolOf, d.Reserve(), mine, got)
		case now.Sub(lastOK) >= ShareStale:
			wake = ApplyShares(ex.ID(), reps, keys, set.PoolOf, d.Reserve(), nil, nil) // no news: no caps, as without a fleet
		}
		if wake {
			d.Wake()
		}
		if err != nil && !failing {
			d.Log.Warn("exchanging replica demand with the other instances (shares lapse 2 s after the last exchange that answered)", "err", err)
		} else if err == nil && failing {
			d.Log.Info("exchanging replica demand again")
		}
		failing = err != nil
	}
}

// DemandReports is this instance's demand on each replica where it has
// any (keys: the replicas' names in the exchange), in total and by tenant
// (tenantsOn nil: in total only): a replica it neither runs, queues nor
// keeps room for anything on is not reported, so it shares nothing there
// and the exchange stays small.
func DemandReports(reps []*Replica, keys []string, waitingOn func(slot int) int64,
	tenantsOn func(slot int, out []peers.TenantDemand) []peers.TenantDemand) []peers.Report {
	var out []peers.Report
	for i, r := range reps {
		var ts []peers.TenantDemand
		if tenantsOn != nil {
			ts = tenantsOn(r.Slot, nil)
		}
		if in, q := r.Count.Load(), waitingOn(r.Slot); in > 0 || q > 0 || len(ts) > 0 {
			out = append(out, peers.Report{Replica: keys[i], InFlight: in, Queued: q, Tenants: ts})
		}
	}
	return out
}

// ApplyShares sets each replica's share from this instance's reports
// (mine, as sent) and the others' entries (nil: none anywhere), poolOf
// naming each replica's pool (Set.PoolOf; nil: each its own), rs what the
// light tenants are kept (server.reserve_margin and reserve_cap, SplitPool). It reports
// whether a share grew or went: that lets queued work through, so the
// dispatch loop is to be woken.
func ApplyShares(self string, reps []*Replica, keys []string, poolOf func(*Replica) PoolKey, rs Reserve, mine []peers.Report, got map[string][]peers.Entry) (wake bool) {
	own := make(map[string]peers.Entry, len(mine))
	for _, rp := range mine {
		own[rp.Replica] = peers.Entry{Instance: self, InFlight: rp.InFlight, Queued: rp.Queued, Tenants: rp.Tenants}
	}
	// The pools (poolOf; nil: each replica its own), of the replicas that
	// take new work. The heavy tenants' floor and an instance's are one
	// request per pool, as the dispatch gate's on one instance.
	pool := make([]PoolKey, len(reps))
	live := make([]bool, len(reps)) // Gone read once: a pool's size and its shares agree
	size := map[PoolKey]int{}
	for i, r := range reps {
		if live[i] = !r.Gone.Load(); !live[i] {
			continue
		}
		if poolOf != nil {
			pool[i] = poolOf(r)
		} else {
			pool[i].Set(r.Slot)
		}
		size[pool[i]]++
	}
	splits := make([]*ShareOf, len(reps))
	byPool := map[PoolKey][]*ShareOf{}
	for i, r := range reps {
		if others := got[keys[i]]; len(others) > 0 {
			e, ok := own[keys[i]]
			if !ok {
				e.Instance = self
			}
			sh := SplitPool(r.ShareBatch(), size[pool[i]], rs, e, others)
			splits[i] = &sh
		}
		if live[i] {
			byPool[pool[i]] = append(byPool[pool[i]], splits[i])
		}
	}
	for _, shares := range byPool {
		FloorOnce(shares)
	}
	for i, r := range reps {
		others := got[keys[i]]
		var share int64
		if sh := splits[i]; sh != nil {
			share = sh.Cap
			r.split.Store(sh)
			r.PeerWeight.Store(PeerWeight(own[keys[i]], others))
		} else {
			r.split.Store(nil)
			r.PeerWeight.Store(0)
		}
		prev := r.Share.Swap(share)
		r.Peers.Store(int64(len(others)))
		wake = wake || (prev != 0 && (share == 0 || share > prev))
	}
	return wake
}

// ShareBatch is the batch the share split divides: the batch limit, or
// fewer where the KV cache binds first, as the last scrape shows it
// (running ÷ KV usage: the requests a full cache holds at their present
// mean size). Every instance reads the same replica, so they divide
// about the same number; a split of max_num_seqs where the cache holds a
// tenth of it would cap nothing, and the slots would stay with the
// instance that refills them first (above).
func (r *Replica) ShareBatch() int64 {
	lim := r.BatchLimit()
	if o := r.Obs.Load(); o != nil && o.OK && o.Running > 0 && o.KVUsage > 0 {
		lim = min(lim, max(int64(float64(o.Running)/min(o.KVUsage, 1)), 1))
	}
	return lim
}

// unshared reports whether this instance's share of r does not bind rt:
// the split holds its tenant light fleet-wide, or has not classified it
// (this instance had not reported it yet) and the dispatch gate holds it
// light. A tenant's first requests here come before its first report:
// bound by a share split among the others, a light tenant's first burst
// waited for the next exchange or a completion while the batch had room
// (fairgen seed 35 with two instances); a flood the gate holds heavy stays
// bound. rt.NoShare asks it for every tenant (Route.NoShare).
func (r *Replica) unshared(rt Route) bool {
	if rt.NoShare {
		return true
	}
	sh := r.split.Load()
	if sh == nil {
		return false // no share, or nothing it binds
	}
	if rt.Tenant == "" {
		return false
	}
	if slices.Contains(sh.Light, rt.Tenant) {
		return true
	}
	return rt.Light && !slices.Contains(sh.Heavy, rt.Tenant)
}

// Bound is this instance's tenants its share of r binds, from the last
// split (nil without one): those the split holds heavy, and of them those
// it holds light but cut (ShareOf.Heavy, ShareOf.Cut). Read-only.
func (r *Replica) Bound() (heavy, cut []string) {
	if sh := r.split.Load(); sh != nil {
		return sh.Heavy, sh.Cut
	}
	return nil, nil
}

// SeqLimit is the sequence count at which r has no room for this
// instance: its batch limit (sizing.go), or less where this instance's
// share (a replica shared with other instances) binds. seqs is the batch
// estimate.
func (r *Replica) SeqLimit(seqs int64) int64 { return r.seqLimit(seqs, false, false) }

// seqLimit is SeqLimit, without the ramp for a tenant alone on its pool,
// and without the share for the gate's view of the batch (FleetOf).
func (r *Replica) seqLimit(seqs int64, alone, noShare bool) int64 {
	lim := r.batchLimit(!alone)
	if sh, ok := r.shareCap(); ok && !noShare {
		return min(lim, seqs-r.Count.Load()+sh)
	}
	return lim
}

// shareCap is this instance's share of r as a count of requests, and
// whether it has one (Share: 0 none, NoSeqs a cap of none).
func (r *Replica) shareCap() (int64, bool) {
	sh := r.Share.Load()
	return max(sh, 0), sh != 0
}

// HeldHeavy reports whether the share split holds tenant heavy on every
// replica of key that another instance uses: where it does, this
// instance's share binds the tenant there.
func (s *Set) HeldHeavy(key PoolKey, tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	shared := false
	for _, r := range s.List() {
		if !key.Has(r.Slot) || r.Share.Load() == 0 {
			continue
		}
		sh := r.split.Load()
		if sh == nil || !slices.Contains(sh.Heavy, tenant) {
			return false
		}
		shared = true
	}
	return shared
}

// PeerWeight is the summed weight of the tenants that others report and
// mine does not (an older instance's report, without tenants, as one of
// weight 1): the tenants on the replica this instance's gate cannot see.
func PeerWeight(mine peers.Entry, others []peers.Entry) int64 {
	seen := make(map[string]bool, len(mine.Tenants))
	for _, td := range mine.Tenants {
		seen[td.Tenant] = true
	}
	var w int64
	for _, e := range others {
		if len(e.Tenants) == 0 {
			if e.InFlight > 0 || e.Queued > 0 {
				w++
			}
			continue
		}
		for _, td := range e.Tenants {
			if !seen[td.Tenant] {
				seen[td.Tenant] = true
				w += max(td.Weight, 1)
			}
		}
	}
	return w
}
