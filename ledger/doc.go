// Package ledger reserves, holds and settles per-tenant budgets (tokens,
// GPU-ms, spend, requests) and concurrency slots for Sluice. It is the
// contract of docs/LEDGER.md: this package defines the shared
// types, the [Ledger] method set, the sentinel errors and the embedded
// [Memory] backend; ledger/redisledger implements the same state machine on
// Redis, and ledger/ledgertest is the one conformance suite both pass.
//
// # Model
//
// Amounts are int64 integer units per [Dim]. A request touches one tenant
// scope plus optionally one api_key and one workflow scope, each named only by
// its [ScopeKey] (an HMAC of the raw id, see [Keyer]). Limits travel with each
// Reserve. Per scope the ledger keeps r (in-flight holds, not windowed), c
// (committed in the current epoch-aligned tumbling window, per dimension and
// window) and n (slots in use). Reserve admits when c + r + h ≤ max for every
// block-mode limit, so holds carry across windows; usage is charged to the
// admission window only while it is still current.
//
// # States
//
//	none → RESERVED (DISPATCHED with Dispatch)    Reserve           r += h
//	RESERVED → DISPATCHED                         MarkDispatched    n += 1
//	RESERVED → RELEASED / EXPIRED                 Release / Reclaim r −= h
//	RESERVED, DISPATCHED → SETTLED                Settle(a)         r −= h; c += a; n −= 1 if taken
//	DISPATCHED → UNRESOLVED                       Reclaim           n −= 1 only
//	UNRESOLVED → SETTLED (Late)                   Settle(a)         r −= h; c += a
//	UNRESOLVED → CHARGED                          Resolve, Reclaim  r −= h; c += h
//	RELEASED / EXPIRED → SETTLED_LATE             Settle(a)         c += a only
//
// Settling a RESERVED record (never dispatched) is accepted and behaves like
// DISPATCHED → SETTLED without a slot. Terminal records stay as tombstones for
// TombstoneRetention.
//
// # Decisions the conformance suite pins (both backends)
//
// LEDGER.md leaves these open; ledgertest's model enforces them:
//   - Operations act on the record's state, not on the clock: a lease past
//     its expiry that Reclaim has not processed yet is still live, so Extend,
//     MarkDispatched and Settle on it succeed (Reclaim may lag, never acts
//     early, and rechecks due-ness, so a racing Extend wins or loses whole).
//   - One Reclaim call moves a due DISPATCHED record to UNRESOLVED and, if
//     its first admission window has already closed, on to CHARGED.
//   - The first admission window of a record is the earliest-closing window
//     over every windowed limit (block or warn) of its scopes; a record with
//     no windowed limit is never charged automatically.
//   - Settle on a RESERVED record (never dispatched) is SETTLED: hold freed,
//     actual charged, no slot touched.
//   - Release: RESERVED by its owner frees the hold; another owner is
//     ErrLeaseLost; RELEASED, EXPIRED or SETTLED_LATE is a no-op (nil);
//     DISPATCHED, UNRESOLVED, SETTLED or CHARGED is ErrDispatched; an unknown
//     id writes a RELEASED tombstone without scopes.
//   - MarkDispatched: the owner's replay on DISPATCHED is nil; another owner,
//     EXPIRED or UNRESOLVED is ErrLeaseLost; other terminal states
//     ErrAlreadyFinal. Warn-mode slot limits count n but never deny.
//   - Resolve on RESERVED or DISPATCHED is ErrConflict; on CHARGED it is
//     Replayed; on other terminal states ErrAlreadyFinal.
//   - Reserve checks the id first (replay, ErrConflict, ErrAlreadyFinal), then
//     admission. A denial names the failing budget
//     limit that resets last (ties: the first in request order); slots only
//     when no budget limit fails. Headroom picks the smallest remaining per
//     dimension (ties: the later reset). Warnings list warn-mode limits with
//     c + r > max after the grant, in request order.
//   - Counters c exist per (scope, dim, window) from the first applied
//     Reserve that names the limit; a charge reaches every such counter of the
//     record's scopes whose current window is the admission window.
//
// # Policy versions
//
// ReserveRequest.PolicyVersion is recorded (Usage.PolicyVersion shows the
// version of the tenant's last admitted Reserve) and never compared. Limits
// travel with every Reserve and are applied to that Reserve only; they are
// never stored as the scope's policy, so refusing an older version would
// protect nothing. It would break things instead: the version is a
// per-process counter that restarts at 1 after a restart, and two
// instances sharing a Redis count independently, so an ordering turns one
// instance's admin change into refusals on every other instance.
//
// # Global (fleet-wide) budgets
//
// A ReserveRequest may carry one KindGlobal scope (conventionally
// [Keyer.GlobalKey]) with the same budget limits as a tenant (no slots
// limit). It is applied on top of the tenant, api_key and workflow budgets:
// a request is admitted only if every block-mode limit, global included, has
// room, and a global denial is a [*DeniedError] with Scope KindGlobal
// (String "global"). The record keeps the global hold in r of the global
// scope until it resolves, exactly like its other scopes, and every Settle,
// Release, Reclaim and Resolve resolves it exactly once. Snapshot(ctx, G, G)
// reads the global scope G; [Memory.AuditTenant] of G (and Audit) checks that
// its r equals the holds of every tenant's open records that carry it.
//
// Memory keeps the global scopes in one global partition shared by every
// tenant (Memory.glob) and does it atomically: an operation on a record
// with a global hold, a Reserve naming a global scope, and a Reclaim of a
// tenant that ever carried one lock the tenant and then the global
// partition (lock order: tenant, then global; Compact and Audit lock every
// tenant in key order, then global), and run at max(tenant time, global
// hwm) so global windows never go back. Global limits carry no policy
// version. The journal replays global holds through the tenants' entries,
// and a compaction snapshot writes the global scopes first (as scope
// entries of the zero tenant). Charges of purged tombstones are not tracked
// for global counters, so the audit recomputes global r but not global c.
// The Redis backend does the same in one script on one server (the record
// names the global scope's hash in its own partition, at max(tenant time,
// global hwm)), and in two steps on a Cluster (reserve the global hold,
// then the tenant holds; drop the global hold when the tenant step
// refuses); see redisledger's global.go for that false-denial window.
//
// # List
//
// List(ctx, tenant, state, max) returns the open records of one state
// (RESERVED, DISPATCHED or UNRESOLVED) for GET /admin/reservations, ordered
// by lease expiry (UNRESOLVED: by when they become chargeable), read-only.
//
// # Charge (outage allowance)
//
// Charge commits usage that ran without a reservation (admitted while the
// ledger was unreachable), exactly once by Ref.ID, as committed usage of the
// window in which it was used: the record is a SETTLED tombstone with no hold
// and source outage, admitted at At (an At after ledger time counts as
// ledger time), so it reaches every counter of its scopes whose current
// window contains At, and nothing when that window has closed (the usage then
// lives in the record and the usage event only, like any late charge). It is
// never denied; Settlement.OverLimit reports a limit left with c + r > max.
// A replay with the same scopes and amounts is Replayed, a different payload
// or an id that names a reservation is ErrConflict; replays are recognised
// for TombstoneRetention, like every record. Memory journals it (opCharge,
// encoded like a Reserve) and audits it like any settlement; a global scope
// is charged in the same atomic step (Memory) or, after the tenant
// partition, under the same id in its own partition (Redis).
//
// # Invariants
//
// I1 admission safety, I2 all-or-nothing, I3 idempotency by request id, I4
// exactly-once resolution, I5 conservation (checked by [Memory.Audit]), I6 no
// minting, I7 refuse rather than clamp ([ErrCorrupt] before any write), I8
// monotonic ledger time (now = max(clock, hwm) per tenant), I9 fail closed.
//
// # Durability of Memory
//
// Without MemoryConfig.Journal the embedded ledger is memory-only: a restart
// forgets all committed usage and in-flight holds. With a journal every applied
// transition is written to it (length, CRC-32C, ledger time, hashed ids,
// integers) before the call returns, so a killed process loses none. Calls
// whose loss in a machine crash could under-charge (MarkDispatched, a
// dispatching Reserve, Grow, a Settle above its hold or of a record recovery
// would expire, Reclaim, Resolve, Charge, Adjust) also wait for a
// group-committed fsync; the others ride the next one (see [Fsync] and
// docs/LEDGER.md §5, which says what recovery makes of each one lost). On
// start the journal is replayed, a
// torn tail is truncated, corruption before it refuses start (ErrCorrupt),
// DISPATCHED records come back UNRESOLVED and RESERVED ones EXPIRED, and the
// journal is compacted into a snapshot of that state (written to a temporary
// file, fsynced, renamed). A failed journal write makes that call
// ErrAmbiguous and every later call ErrUnavailable until restart (fail
// closed). Run also compacts online once the journal passes CompactBytes
// ([Memory.Compact] stops every tenant for one sequential write and fsync of
// the state).
package ledger
