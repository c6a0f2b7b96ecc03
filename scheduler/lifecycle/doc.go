// Package lifecycle is the call lifecycle: one call from admission to its
// one ending. [Engine.Start] admits a call (bound, reserve, enqueue,
// dispatch, the replica's first byte); [Ticket.Finish] delivers its answer,
// settles it exactly once and ends it, in one place that runs even if
// nothing is written. It alone knows a call: the rooms a call passes
// through (queue, ledger, fleet, gate, settle, policy) are handed values.
// The composition root (package scheduler) builds the Engine on the shared
// rooms ([Deps]) and reads it through its exported methods; the client
// edge (package scheduler/edge) reaches it through the ports of
// edgeport.go only.
//
// # Request path
//
//  1. Authenticate: the bearer key's SHA-256 maps to a tenant (the body and
//     free headers never choose the tenant).
//  2. Bound: the body is parsed only as far as needed (package vllm); input
//     tokens are counted (bytes bound or the replica's /tokenize), the output
//     cap is min(client, tenant, budget) and written into the upstream body,
//     and the deadline is min(tenant max_wait, X-Request-Timeout, server max).
//  3. Reserve: one all-or-nothing ledger Reserve of requests, input, output,
//     tokens, GPU-ms and usd_micros under the tenant scope, plus the
//     workflow envelope (X-Workflow-Id) and the fleet-wide global scope when
//     configured. A token budget that cannot fit the cap lowers the cap to
//     what it still allows. While the ledger cannot answer, a tenant with an
//     outage allowance is admitted without it and charged later (settle/outage.go).
//  4. Enqueue: the tenant's bounded queue (package queue); a full queue is
//     429 queue_full at once and the hold is released.
//  5. Dispatch: the queue picks by band, weighted virtual counters and FIFO;
//     the predicate parks a tenant at its in-flight cap and blocks when no
//     replica has room (SCHEDULING §7: load + size ≤ K_r, with vLLM's KV
//     usage taken when larger; seqs < max_num_seqs, seqs being this
//     instance's own plus what the last scrape showed beyond its own, so
//     work another instance or an abort-ignoring replica keeps running still
//     counts: fleet/sizing.go), and the fair-share gate (scheduler/gate) holds a heavy tenant
//     back from its pool's light tenants' reserve; shares, reserve and room
//     are per pool (fleet/pools.go, gate/pools.go). The request then takes a ledger slot
//     (MarkDispatched) before its first upstream byte; a slot denial
//     requeues it at its head.
//  6. Execute: a streamed request goes upstream with continuous usage
//     forced on, and its client gets vLLM's chunks passed through with the
//     usage it did not ask for removed; a non-streamed one goes upstream
//     non-streamed and its body passes through, or, when its cap is above
//     upstream.non_streamed_interval and a stream carries it faithfully,
//     as a stream of that interval whose body Sluice re-assembles, so that
//     an abort has usage to settle from (upstream.go). A stream counts as
//     started with its first event (vLLM sends it with the first output):
//     until then it may wait in the replica's queue, and a tenant's above
//     its fair share is taken back into Sluice's queue when a scrape shows
//     the replica full (takeback.go).
//  7. Settle: once, from vLLM's final usage or, for an aborted stream, the
//     last cumulative usage plus one stream interval per unfinished choice
//     (allowanceFor); a non-streamed request that reported nothing is
//     charged its hold; fair-share counters are reconciled and replica
//     room and slots freed.
//
// # Call lifecycle
//
// A call is a state machine (lifecycle.go): new → reserved → queued →
// dispatched → streaming → one of released, settled, unresolved; a slot
// denial takes a dispatch attempt back to queued. [call.to] is the only way
// to move it, and the ledger, the queue's slot and the replica's room are
// touched only by the transitions: [Engine.release] (reserved or queued →
// released) and [Engine.finish] (dispatched or streaming → settled). Each
// checks the phase first, so a second ending is a no-op. unresolved means
// this instance handed the ending to the outbox or to an owed outage
// charge.
//
// Who owns what:
//
//   - The request goroutine (the edge handler, then its stream writer) owns
//     the call: phase, plan, holds, stream, usage, rep. The edge only
//     parses, authenticates and writes bytes; Start (admit, await,
//     execute) and Finish (drainStream or pump, finish) do the rest on that
//     goroutine.
//   - The dispatch loop (dispatch.go) owns nothing of a call: under the
//     queue's mutex it reserves replica room and hands the replica over the
//     call's dispatched channel; expiry arrives on expired.
//   - The settlement room (package scheduler/settle) owns each call's lease
//     from its Reserve to its terminal transition, and the endings the
//     ledger has not acknowledged.
//
// # Ledger ids and idempotency
//
// A call without an Idempotency-Key has a random ledger id; one with a key
// has Keyer.IdempotentID of the key, then of key‖generation after
// attempts that never ran (idempotency.go). Every Reserve attempt carries a fresh
// nonce: the store client's own retry after a lost reply answers the
// original grant (never a 409), another attempt answers Replayed with the
// record's state (409 idempotency_conflict, details.state in_flight or
// unresolved). A completed non-streamed attempt's body is kept per instance
// (LRU, 32 MiB, 1 h) and returned to its retries; elsewhere a retry gets
// 409 details.state completed. Replay or conflict is decided on the
// client's request (endpoint and body), never on the holds: another body
// under the key is 409 details.state conflict. A keyed request is never admitted on an
// outage allowance (only the ledger knows whether the key ran): 503.
//
// Policy versions only label audit lines: the ledger never orders them
// (limits travel with each Reserve), so a restart or another instance with
// a smaller counter is served like any other.
//
// # Invariants
//
//   - Every admitted call ends in exactly one of: released (never
//     dispatched; [Engine.release]), settled ([Engine.finish], zero with
//     SourceNotSent when nothing reached the replica), or left DISPATCHED
//     for the ledger's lease expiry when the process dies. finish is the
//     only settle path and runs once per call (its phase guard).
//   - Nothing is sent upstream without an acknowledged MarkDispatched, and
//     the deadline is re-checked after it (sluice_expired_dispatch_total
//     stays 0).
//   - A client disconnect cancels the call's context: queued calls leave the
//     queue at once and release; running calls close the upstream
//     connection (vLLM's abort signal) and settle from what was streamed.
//     fasthttp reports no disconnects, so [connwatch] watches each client
//     connection with EPOLLRDHUP; a failed streaming write does the same,
//     and so does one that blocks for server.stream_write_timeout (a client
//     that stopped reading: abort cause client_stalled).
//   - Ledger store errors fail closed (503 ledger_unavailable); failed
//     endings are retried by the outbox with the same id, and every held
//     record's lease is extended every lease_ttl/3 and fenced before it can
//     lapse (LEDGER I10). ledger.lease_ttl may not pass the ledger's lease
//     bound, at start-up or on reload; a reloaded lease_ttl sets the next
//     heartbeat period and the next extensions.
//   - Holds are bounded before they reach the ledger: n ≤ 128 and every
//     product (cap × choices, prices × tokens, cost weights × tokens) is
//     overflow-checked; out of range is 400 invalid_request naming the
//     parameter. A tenant without a windowed budget gets a never-binding
//     one (policy.ResolutionLimit) so its UNRESOLVED records resolve.
package lifecycle
