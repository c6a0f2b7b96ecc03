// Package redisledger is the Redis backend of the Sluice budget ledger
// (LEDGER.md §6): several front ends share tenants' budgets and slots through
// one Redis (standalone, Sentinel or Cluster). It runs the same state machine
// as ledger.Memory and passes the same conformance suite (ledger/ledgertest).
//
// # One script per operation
//
// Every operation is one Lua script (reserve, dispatch, extend, settle,
// release, expire, resolve; scan, snapshot and records are read-only and
// run as read-only functions of the library with FCALL_RO, or EVALSHA_RO
// where the server has no functions). Scripts run atomically but Redis has no rollback, so each one
// first reads and validates everything it will touch (integers, ranges,
// states, epoch, policy version, and that KEYS match the record's scopes)
// and only then writes. Stored damage is refused
// as ledger.ErrCorrupt with nothing written, never clamped. An operation
// reads only the scope fields it uses (prelude.lua, scope_fields: the
// limited dimensions and those its hold moves), so damage to a counter it
// neither reads nor writes is left to the operations that do. Scripts start
// with a "#!lua" shebang (no flags), so an out-of-memory Redis refuses them
// before they run. go-redis runs them with EVALSHA and falls back to EVAL on
// NOSCRIPT; they are never pipelined. Every write script is also a function
// of the batch script, which runs concurrent operations of one standalone
// server (or one Cluster node: several slots in one call, through the
// library's cross-slot function, each operation after the first probing its
// keys first; lua/batch.lua) in one call, in order (batch.go). Batches run
// as FCALL of a function library with the same code (scripts.go), which
// keeps parsed specs, amounts and windows across calls; EVALSHA of the
// batch script where the server has no FUNCTION. Within one call a scope
// hash is read once (HMGET) and written back once (HSET of the counters'
// new values, which the call read and validated) at its end.
//
// # Keys
//
// Every key of a tenant starts with "<prefix>:{T}:" where T is the tenant's
// ScopeKey in base64url, so all keys of one call share a Cluster slot (on
// one server, a record with an inline global scope also names the global
// partition's scope hash and meta; see "Global budgets"); every key is
// passed in KEYS and no script builds a name. The store only ever sees
// HMAC'd scope keys and random request ids, never a raw tenant, API key or
// workflow id.
//
//	m        HASH  hwm, epoch, fence_until, pv
//	L        ZSET  RESERVED/DISPATCHED request ids by lease expiry (ms)
//	U        ZSET  UNRESOLVED ids by the end of their first admission window
//	q:<id>   STRING the record, packed (struct.pack, scripts.go recordFormat):
//	               st, le (lease), te (tombstone end), sl (slot taken), ra
//	               (chargeable at), ls (state before the terminal one), at
//	               (admitted), o(wner), dg (digest), h (held), sp (scopes and
//	               limits), wi (admission window per W), a (actual), src, g
//	               (the global hold "G.gid", if any; in a global hold's own
//	               record, its request "^T.id", dropped from its tombstone),
//	               na (attempt nonce).
//	               Records of the layout before it (a HASH of those fields as
//	               text) are still read, and stored packed when next written.
//	               A process of that earlier version refuses a packed record
//	               (WRONGTYPE, before it writes anything): during a rolling
//	               upgrade it cannot settle or reclaim records upgraded
//	               processes wrote; they can (and reclaim its leases).
//	               A SETTLED or SETTLED_LATE tombstone keeps no sp, wi or
//	               o: nothing charges it again, and its replays answer
//	               from st, h, a, src, ls, g and dg (about a third of a
//	               tombstone's memory, and tombstones are most of a busy
//	               ledger's memory)
//	s:<S>    HASH  per scope: r:<d> (holds, every dimension), n (slots),
//	               c:<d>:<W> with w:<d>:<W> (committed and its window index),
//	               o:<d> (overrun), lim (the scope's limits as last reserved)
//
// One key has no tenant tag: "<prefix>:partitions", a SET of every tenant
// and global partition a Reserve has written in (added with a plain SADD
// before a process first writes there). Run reclaims every member, so holds
// of a crashed instance are reclaimed by the survivors even for tenants
// their own configuration never named (a reload added them).
//
// Calls that act on an existing record (MarkDispatched, Settle, Release,
// Reclaim, Resolve) need its scope keys: the Ledger remembers the scopes of
// records it reserved, and otherwise the script answers with the stored
// scopes and the call is retried with the right KEYS (at most twice: a
// record's spec changes once, to none, when it becomes such a tombstone).
//
// # Time
//
// Ledger time is Redis TIME in ms raised to the tenant's high-water mark
// (hwm), which every write persists, so it never goes back across failovers.
// Windows are tumbling and aligned to the Unix epoch; holds live in the
// unwindowed r, and usage is charged to the admission window only while it is
// still current. Terminal records stay as tombstones until TombstoneRetention
// of ledger time has passed (and Redis drops them by PEXPIRE in real time).
//
// # Failures
//
// Every call is bounded by StoreTimeout (default 250 ms), retries included.
// An error raised before a command could reach Redis (dial failure, pool
// exhaustion, a refusal like OOM, BUSY, LOADING or READONLY) is
// ledger.ErrUnavailable; anything else (timeouts, a broken connection) is
// ledger.ErrAmbiguous: the script may have run, possibly several times under
// go-redis retries, which is harmless because every script checks the
// request id first. Callers resolve ambiguity by replaying the same id.
//
// Store loss is detected with a random per-tenant epoch that front ends cache
// and send: a missing or different stored epoch fences the tenant's Reserves
// (ledger.ErrRecovering) until MaxLeaseTTL has passed, and Extends of old
// leases fail (ledger.ErrLeaseLost), so owners abort upstream (I10). A
// process without a cached epoch adopts the stored one.
//
// # Global budgets and List
//
// A KindGlobal scope G has its own partition "<prefix>:{G}:…" with the same
// layout as a tenant's. On one server (standalone or Sentinel, batched) the
// tenant record names G's scope hash like its other scopes (its limits
// marked B/W in sp, G's meta key passed last) and every operation moves
// that hold with the others, at the later of both partitions' ledger times.
// On a Cluster a Reserve naming G reserves a per-attempt hold there first,
// then the tenant holds, and every later operation on the tenant record
// resolves the global hold by id inside the same method; such records store
// the hold as field g (global.go documents both, and the two-step window in
// which a request may be falsely denied). List reads
// L or U with ZRANGE and the records of each page with one read-only script
// (so not one atomic cut).
//
// # Design rationale
//
// Lua scripts rather than Redis Functions: go-redis handles NOSCRIPT
// transparently, there is no FUNCTION LOAD step to version, and a failover
// that empties the script cache only costs one EVAL per script. The read-only
// Reclaim scan lists due ids; each id is then expired or charged by its own
// script that rechecks due-ness, so a racing Extend or Settle wins or loses
// atomically and Reclaim never acts early. Run scans every partition each
// tick from every instance, nearly all of them idle, so its pass scans up to
// 128 partitions of one server or Cluster node in one read-only call (the
// library's scans function, reclaim.go; a Cluster's nodes in parallel),
// reclaims the due ids it returns, and scans alone only the partitions the
// call could not read.
package redisledger
