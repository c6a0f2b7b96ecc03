// Package ledger reserves, holds and settles per-tenant budgets (tokens,
// GPU-ms, spend, requests) and concurrency slots for Sluice. It is the
// contract of /work/shared/design/LEDGER.md: this package defines the shared
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
// transition is appended (length, CRC-32C, ledger time, hashed ids, integers)
// and fsynced before the call returns; on start the journal is replayed, a
// torn tail is truncated, DISPATCHED records come back UNRESOLVED and RESERVED
// ones EXPIRED.
package ledger
