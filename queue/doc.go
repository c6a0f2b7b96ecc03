// Package queue holds admitted requests in bounded per-tenant queues, picks
// the next one by strict priority band and weighted virtual token counters
// (VTC), and expires requests at their deadlines. It does no I/O and knows
// nothing of replicas, HTTP or the ledger; the scheduler supplies a dispatch
// predicate and an expiry callback. See SCHEDULING.md §3–§6.
//
// # Model
//
// A tenant has a weight w, a default band, bounds (max_depth, max_bytes), a
// max_wait and an order (FIFO or EDF). A flow is a (tenant, band) pair; it
// owns the tenant's queued entries of that band, ordered by arrival (FIFO) or
// by deadline then arrival (EDF), and a virtual counter v in cost units per
// unit weight.
//
//   - Enqueue checks, in this order, the tenant's depth and bytes and the
//     instance's depth and bytes, under the one mutex, so bounds are exact
//     under any concurrency; a refusal is a [*FullError] (wrapping [ErrFull])
//     with the bound and a Retry-After estimate. The newest arrival is refused.
//   - Every entry has a deadline: min(client deadline, arrival + tenant
//     max_wait, arrival + server max_wait), and it waits until then unless
//     the operator opted its tenant into shedding ([Config.ShedAfter]).
//     An expiry names the bound that set the deadline ([Reason]).
//   - A flow is eligible when it has queued entries and its tenant is not
//     parked. Each band keeps a 4-ary min-heap of its eligible flows keyed by
//     (v, eligibility sequence); keys sit inline in the heap slots and heap
//     positions in a dense array, so sifting touches no flow.
//   - [Queue.Next] scans bands from 0 and, within the first band with an
//     eligible flow, takes the heap's minimum flow and its head. Two
//     standing-queue policies are opt-ins, off unless configured (per
//     tenant or for all): a FIFO flow whose head has waited
//     [Config.LIFOAfter] offers its newest entry instead (adaptive LIFO:
//     under a standing queue what is served still starts in time), and a
//     head that has waited [Config.ShedAfter] is shed ([ReasonShed]): a
//     standing queue adds delay, never throughput (CoDel's "bad queue").
//     EDF flows are exempt. The predicate answers Dispatch (charge v += cost/w and hand it out), Park
//     (the tenant leaves every band heap and keeps its entries; it rejoins on
//     [Queue.Unpark] or after the park backoff) or Block (stop; nothing is
//     dispatched, not even a smaller request of another tenant or band).
//   - Lift: a flow that becomes eligible (new backlog, or unparked) gets
//     v = max(v, band minimum), where the band minimum is the smallest v among
//     the band's eligible flows, or the counter of the band's last dispatch
//     when none is eligible. Idle or parked time earns no credit; a deficit
//     survives, except that a flow with no queued entry for IdleTTL re-enters
//     exactly at the minimum.
//   - [Queue.Reconcile] adds (actual − predicted)/w at completion;
//     [Queue.Requeue] subtracts the charge again (the request did not run).
//   - Counters of a band are shifted down together when its minimum passes
//     2^40, keeping float64 precision well below one cost unit.
//
// # Ownership and invariants
//
//   - Exactly one of dispatch ([Queue.Next] returning it), expiry (delivered
//     to Deps.OnExpire) and cancellation ([Queue.Cancel] returning true) owns
//     each entry. A dispatched entry goes back to the queue only through
//     [Queue.Requeue] (same Handle), after which the same rule applies again.
//   - No entry is handed out at or after its deadline: Next expires an expired
//     head instead of offering it. [Queue.Tick] (driven by [Queue.Run] with
//     one runtime timer armed at the earliest deadline or park end) removes
//     and reports every expired entry at its deadline; on the fake clock of
//     testing/synctest that is with zero lateness. On a real clock the timer
//     alone can be up to about 1 ms late, because Go's netpoller on Linux
//     sleeps in whole milliseconds; [Config.ExpirySpin] (1ms) wakes early and
//     polls the last stretch, keeping lateness in microseconds
//     (BenchmarkExpiryLateness).
//   - Expiry is delivered synchronously to Deps.OnExpire with the mutex held,
//     exactly once per entry; it must not block or call the Queue. There is
//     no buffer, so there is no overload drop.
//   - Queued counts (depth, bytes, queued cost) always equal the sums over
//     queued entries; a flow is in its band's heap if and only if it is
//     eligible; a band below (numerically above) the dispatched one never has
//     an eligible flow at the moment of dispatch.
//   - Steady-state Enqueue, Next, Release and Cancel allocate nothing: entry
//     nodes come from a free list and heaps reuse their slices. A Handle
//     carries a generation, so a handle to a recycled node is refused.
//   - Nothing panics; bad input returns an error or false.
//
// # Fairness bound
//
// Let C_i be the largest charge one request of flow i can carry (predicted
// plus any overrun reconciled: w_in·max_input + w_out·max_tokens in token
// mode) and H_i its refund credit: the most that reconciliations of its
// requests in flight at any moment can refund, at most (in-flight cap)·C_i.
// For flows i and j of one band that are both eligible (backlogged and not
// parked) throughout [t1, t2], with S the charged service in that interval
// (dispatch charges plus reconciliations):
//
//	|S_i/w_i − S_j/w_j|  ≤  (C_i + H_i)/w_i + (C_j + H_j)/w_j
//
// With exact predictions H = 0 and, for equal weights, this is 2·C_max, the
// bound of start-time fair queueing. A per-tenant in-flight cap replaces
// VTC's KV-pool term, so the bound does not grow with the hardware.
//
// Proof. While both are eligible no lift touches them, so S_i/w_i − S_j/w_j
// over the interval equals the change of v_i − v_j. We show that at any time
// t in the interval v_i − v_j ≤ C_i/w_i + H_j/w_j (and symmetrically). Let s
// be i's last dispatch at or before t. Flow i was picked at the band minimum,
// so v_i(s⁻) ≤ v_j(s), and the pick together with any later reconciliation of
// that request raises v_i by at most C_i/w_i; other changes of v_i after s are
// reconciliations of earlier requests, which only lower it (their overruns
// are already inside C_i). Meanwhile v_j can fall only by refunds: a request
// j dispatched after s is charged its prediction before any refund of it, so
// its net effect is ≥ 0, and requests in flight at s refund at most
// H_j/w_j in total. Hence v_i(t) − v_j(t) ≤ C_i/w_i + H_j/w_j (if i was not
// dispatched since t1, v_i(t) ≤ v_i(t1) and the same argument from t1 gives a
// smaller bound). Subtracting the symmetric bound at t1 gives the interval
// bound above. A Block verdict stops every flow alike and a Park makes a flow
// ineligible, so neither breaks the argument; after a park the lift restarts
// the comparison without credit.
//
// Delivered service (tokens as produced) lags charged service by at most what
// is in flight, which adds at most H_i/w_i + H_j/w_j. Several front-end
// instances each keep this bound for their own arrivals; package
// queue/fleet merges their counters and states the fleet-wide bound
// (SCHEDULING §9).
//
// # Work conservation (the scheduler's dispatch gate)
//
// The queue orders; the scheduler's predicate (scheduler/lifecycle/dispatch.go) only
// gates. There is no per-tenant cap by default (`concurrency` unset), so:
//
//   - Shares are per pool (the replicas serving a model): a tenant competes
//     only with the tenants whose requests can use the same replicas.
//   - A tenant alone on its pool, or tenants whose averaged demand fits the
//     pool together, are never held back: whenever a replica has room the
//     pick is dispatched (the peak concurrency and throughput of direct
//     vLLM), whatever other pools carry.
//   - Under contention a tenant whose load (averaged demand, or offered
//     load λ·W when more) exceeds 3× its max-min fair share of the pool is
//     heavy until it is back within its share, and may not start work
//     inside the reserve kept for the pool's light tenants (their recent
//     demand peaks or offered load, whichever is more); it may always keep
//     one request in flight where that leaves the light tenants room for
//     their noise.
//
// Bound: a request of a light tenant whose tenants' demand stays within
// their recent peaks or offered load finds room at once, except for the
// heavy tenants' floor of one request each; otherwise it waits at most
// until completions free its size, since from its arrival no heavy tenant
// starts work in room it needs and the pick prefers it (lower counter):
// at most one service time of the running requests (≤ max_tokens decode
// steps). A light tenant with a backlog is reserved only what it lacks of
// its max-min share and competes by its counter beyond that (reserving
// more would starve a peer the counters favour). The work-conserving
// exception is the start: a tenant alone on an idle pool takes it all, and
// a light tenant that arrives then waits for those requests to finish.
// Under overload a tenant's requests wait up to their deadlines; the opt-in
// adaptive LIFO above keeps what is served within an SLO shorter than
// max_wait.
// Idle tenants' reserve ages out within the peak window (30 s), or sooner
// once a tenant has been silent for ten of its mean inter-arrival gaps
// (it has left; a Poisson tenant pauses that long with probability e^-10),
// so the shares they do not use are lent to the others. Requests are never
// aborted to make room: once a stream has sent bytes it cannot be replayed
// without executing twice, and before that the window is one prefill step.
//
// # Design rationale
//
// Expiry is a deadline heap plus one timer, not a wheel or a sweep: each
// operation is O(log n), the timer fires at the exact earliest deadline, and
// it needs no tick granularity to reach 1 ms. Charging the prediction at
// dispatch rather than as tokens stream keeps one flow from winning every
// pick while a batch fills. The dispatch predicate runs under the mutex so
// that "pick" and "take" are one atomic step; anything slow (ledger round
// trips) happens after Next, undone with Requeue.
package queue
