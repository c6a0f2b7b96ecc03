// Package chaos is Sluice's seeded fault simulator for the whole system, in
// the spirit of TigerBeetle's VOPR and FoundationDB's simulation testing.
//
// Each run drives real `sluice serve` processes (the embedded ledger with a
// journal, two instances sharing a real redis-server, or two sharing a real
// three-node Redis Cluster) in front of
// in-process simulator replicas, with a random but seed-reproducible
// schedule of events: streamed and non-streamed chat and completion
// requests, Idempotency-Key retries, client disconnects at every stage
// (queued, prefill, decode), client deadlines, out-of-range parameters,
// admin clamps and budget changes, reloads that add a tenant, instance
// kill -9 (with and without restart), Redis reply loss (a proxy swallows the
// reply of a script that ran, so go-redis retries it), Redis stalls
// (SIGSTOP; one node of the Cluster), a tenant's Cluster slot moved to
// another node under traffic (as a resharding does it), and replica faults
// (connections cut mid-stream, SSE error events, errors before the stream,
// engine stalls).
//
// After the traffic the run waits for quiescence (leases expire and are
// reclaimed by the servers themselves) and checks the invariants from three
// vantage points — the responses the clients saw, what the replicas executed
// (recorded by a middleware around each replica) and the ledger itself:
//
//   - every request got exactly one answer, from the pinned error set: no
//     500, no 409 without an Idempotency-Key, no transport error unless the
//     client left or its instance was killed;
//   - at most one execution per Idempotency-Key;
//   - nothing reached a replica after its deadline;
//   - a tenant's completed requests running at the replicas never exceed its
//     concurrency cap (summed over instances that do not share a ledger);
//   - requests charged = requests the replicas executed (minus UNRESOLVED
//     records left by killed instances, and outage usage stranded in the
//     owed-charges file of an instance killed and never restarted, both
//     named in the report), and tokens
//     charged within [Σ lower, Σ upper] of what the replicas delivered:
//     exact for completed requests, the documented abort allowance for
//     aborted ones;
//   - zero reserved holds and zero slots after quiescence except the holds
//     of UNRESOLVED records;
//   - a block token budget is never exceeded beyond the abort allowance;
//   - the global budget holds and is charged exactly what the tenants are.
//
// A failing seed prints the seed and the event log; running the same seed
// again replays the same schedule (wall-clock timing between processes is
// not deterministic, the event sequence is).
//
// `make test` runs a short fixed set of seeds per backend (memory, redis,
// cluster); `make chaos
// SEEDS=N` runs N seeds per backend (flags -chaos.seeds, -chaos.base,
// -chaos.seed to replay one).
package chaos
