// Package scheduler is Sluice's admission pipeline: the fasthttp edge, the
// dispatch loop, settlement and the admin API. It turns each OpenAI-style
// request into exactly one ledger outcome.
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
//     outage allowance is admitted without it and charged later (outage.go).
//  4. Enqueue: the tenant's bounded queue (package queue); a full queue is
//     429 queue_full at once and the hold is released.
//  5. Dispatch: the queue picks by band, weighted virtual counters and FIFO;
//     the predicate parks a tenant at its in-flight cap and blocks when no
//     replica has room (SCHEDULING §7: load + size ≤ K_r, seqs < max_num_seqs,
//     with vLLM's own running count and KV usage taken when larger, so work
//     another instance or an abort-ignoring replica keeps running still
//     counts). The request then takes a ledger slot (MarkDispatched) before
//     its first upstream byte; a slot denial requeues it at its head.
//  6. Execute: the body goes upstream with stream and continuous usage
//     forced on; streaming clients get vLLM's chunks passed through with the
//     usage they did not ask for removed, others a re-assembled body.
//  7. Settle: once, from vLLM's final usage or, for an aborted stream, the
//     last cumulative usage plus one token per unfinished choice; fair-share
//     counters are reconciled and replica room and slots freed.
//
// # Invariants
//
//   - Every admitted call ends in exactly one of: released (never
//     dispatched; [Server.release]), settled ([Server.finish], zero with
//     SourceNotSent when nothing reached the replica), or left DISPATCHED
//     for the ledger's lease expiry when the process dies. finish is the
//     only settle path and runs once per call (call.settled).
//   - Nothing is sent upstream without an acknowledged MarkDispatched, and
//     the deadline is re-checked after it (sluice_expired_dispatch_total
//     stays 0).
//   - A client disconnect cancels the call's context: queued calls leave the
//     queue at once and release; running calls close the upstream
//     connection (vLLM's abort signal) and settle from what was streamed.
//     fasthttp reports no disconnects, so [connwatch] watches each client
//     connection with EPOLLRDHUP; a failed streaming write does the same.
//   - Ledger store errors fail closed (503 ledger_unavailable); failed
//     settlements are retried by the outbox with the same id, and running
//     calls extend their lease every lease_ttl/3 and abort upstream when the
//     lease is lost or cannot be extended in time (LEDGER I10).
//
// Operators change budgets and clamps through the admin API (adminops.go);
// each change builds a new policy version on top of the config file, so
// queued and running requests keep the limits they were admitted under.
// Automatic clamps (package abuse) use the same path.
//
// statusFor is the one place that maps outcomes to HTTP statuses and the
// pinned error codes of ARCHITECTURE.md §3.3.
package scheduler
