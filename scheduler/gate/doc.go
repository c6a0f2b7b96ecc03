// Package gate is the fair-share dispatch gate as pure functions of loads
// and time. Given every tenant's load on one pool (TenantLoad), the pool's
// room (FleetLoad) and the time (Unix nanoseconds from the caller's
// clock), Gate.Assess says whether the candidate tenant is light and, when
// it is heavy, the fraction of the pool it must leave free, which
// FleetLoad.FitsBeyond checks a request against. WithinShare says whether
// a tenant asks for no more than its max-min share, for the caller's
// choice between parking and blocking when the pool is full. Reserved is
// what heavy verdicts kept free lately, for the operator
// (sluice_replica_reserve_ratio); Stands and Steady are what the share
// split across instances reads of a tenant (Pools.DemandOn).
//
// What it owns: the gate's memory of each tenant on the pool (averaged
// demand, demand peaks, arrival rates, service times), the rules below,
// and the per-pool load table the loads come from (Pools: each tenant's
// held, queued and served counts per pool, and the tenants parked on a
// full pool). What it may touch: the values it is handed, nothing else. It
// never sees a request, a replica, the queue or the policy, and it imports
// nothing of Sluice: a request keeps its own Place (pool, spot, when it
// took room) and moves it by value (tenant, size, whether it ran); package
// scheduler reads the replicas and the policy, passes the tenants'
// weights and server.reserve_hold, and acts on the verdict (dispatch,
// park, block), unparking the names the table hands back. The caller holds
// the queue mutex and the table's lock (Pools.Lock) across a decision, so
// a Gate has no lock of its own; there is one Gate per pool.
//
// The queue decides which request goes next (bands, then weighted virtual
// counters); the gate decides only whether it may start now. Everything
// below is per pool (the replicas serving the request's model): a tenant's
// demand, the level, the reserve and the room are its pool's, so tenants
// compete only for replicas they can both use.
//
//   - Each tenant's load on the pool is what it asks for: its demand (in
//     flight + queued, as a fraction of the pool's sequences or tokens)
//     averaged with time constant shareWindow, or its offered load λ·W
//     (arrival rate over forecastWindow × its mean service time) when that
//     is more. The average of a tenant that has just started lags its
//     offered load by a service time (its in-flight count takes that long
//     to build up), which made a new flood light for seconds and the light
//     tenants' share look smaller than it is. The service time is the
//     tenant's own, the pool's, or while nothing has completed here the
//     replicas' own latency (FleetLoad.Svc). The max-min fair level λ of
//     the loads (Σ min(load_i, w_i·λ) = 1) says what each tenant may
//     claim. While the loads fit the pool nobody is heavy and every
//     request may use any room: a lone tenant, or tenants that together
//     do not fill the pool, get all of it.
//   - A tenant whose load is more than lightMargin × its claim, or whose
//     averaged demand is more than the whole pool, is heavy (a tenant
//     whose claim is nearly the pool because the others ask little is no
//     peer near its share when it asks for more than all of it; its
//     forecast alone does not count, as a Poisson cluster of long requests
//     forecasts more than the pool), and stays heavy until its load is
//     within its claim (hysteresis: a light tenant pausing between
//     requests raises the level, which must not turn a flood light for a
//     moment and let it fill the pool).
//   - A heavy tenant is held by the reserve only while it is sustained:
//     its arrival rate over sustainWindow × its mean service time × one
//     request's share of the pool above its weighted share of the tenants
//     present. One heavy by a burst, or by a backlog that grew while it
//     was held, at a rate within its share is let through as light: held,
//     its room could fall below what its arrivals need and its queue grow
//     for good. Arrivals count requests the queue refused (Pools counts a
//     request before Enqueue), so a flood whose queue is full reads at its
//     real rate; a closed loop's arrivals are its completions, so it is
//     held while it runs above its share.
//   - A bursty tenant is let through as light whatever its recent rate or
//     standing queue: its arrivals over server.reserve_hold offer at most
//     burstyShare of its weighted share, and it asks (holds and queues) no
//     more than it did in a span of queueing that ended, its queue
//     drained, within that time. A closed loop held at its floor never
//     drains; a flood asks more than it ever did. One burst lifts the
//     rate over sustainWindow above the share for seconds and the queue
//     stands while held, which read such a tenant as a flood.
//   - A tenant that becomes active is read at its arrivals after its
//     first event over the time since (youngRate), for its first
//     forecastWindow, once it has arrived in youngEvents events spanning
//     youngSpan: the averaged rates read a flood that starts at a
//     fraction of its rate for its first second, and beside light
//     tenants holding most of the pool it took what they had free. A
//     burst is one event, or a few milliseconds of them.
//   - A tenant's last surgeEvents arrival events are read alone
//     (surgeRate) when they offer more than surgeShare times its share:
//     a tenant that trickles and then floods is never young. The reading
//     counts in what it asks of the pool and makes it heavy while it
//     lasts and for attackWindow after, while its load is above its claim:
//     a light tenant's Poisson cluster reads so now and then, and with the
//     open-ended hysteresis of a load above its claim it stayed heavy,
//     while a flood's last arrivals read below the bound in a lull before
//     its averaged load passes it.
//   - A heavy tenant may start work only outside the reserve: what the
//     light tenants will hold, less what they hold now, at least
//     server.headroom while one is active. What they will hold is the
//     larger of their demand peaks over the last peakWindow (plus
//     server.reserve_margin, default burstK, Poisson standard
//     deviations) and their summed offered load (plus forecastK).
//     Offered loads and deviations count requests of each
//     tenant's own size (a pool whose KV cache binds holds fewer than
//     max_num_seqs), so a peak of one request has a deviation of one
//     request, whatever the pool's sequences. A light tenant idle right
//     now keeps its peak reserved until it ages out; one with a backlog
//     is reserved what it lacks of its claim, no more (a heavy peer keeps
//     what the level leaves it).
//   - With no heavy request in flight on the pool a heavy tenant may start
//     one, unless a light tenant waits, where that leaves the light
//     tenants floorK standard deviations of room over what they hold:
//     squeezed, never starved, and the floor costs their peaks one slot,
//     not a share (a quarter of its share did: the victims' p99 wait in
//     the flood preset doubled).
//   - An idle tenant's peak is kept while it may only be pausing: idleGaps
//     of its mean gaps between arrivals (between bursts, for a tenant that
//     sends several at once), the larger of its recent and its long-run
//     mean gap (over server.reserve_hold), at most server.reserve_hold; the
//     peak kept spans at least peakWindow. After that its share is lent; when it
//     returns its new demand enters the reserve at once, heavy tenants stop
//     starting work, and the next completions go to it.
//   - The forecast's rate is at most longK × the long-run rate: one burst
//     of a light tenant is not forecast as a flood.
//
// Shares are tested in des_test.go: a discrete-event run of the real queue
// and this gate, one or two pools, on a manual clock; fairgen_test.go runs
// seeded scenarios on the same harness with the replica's learned batch
// (package fleet, which only the tests import here).
package gate
