// Package chaos is Sluice's seeded fault simulator for the whole system, in
// the spirit of TigerBeetle's VOPR and FoundationDB's simulation testing.
//
// Each run drives real `sluice serve` processes (the embedded ledger with a
// journal, two instances sharing a real redis-server, or two sharing a real
// three-node Redis Cluster) in front of
// in-process simulator replicas, with a random but seed-reproducible
// schedule of events: requests to every endpoint family Sluice bounds
// (streamed and non-streamed chat and completions; /v1/embeddings with
// input a string or a list, and its chat form; /v1/score, /v1/rerank,
// /pooling, /classify; /v1/responses, streamed, non-streamed and cut by
// its client at the first delta), some with counted extras (RAG
// documents, image parts, a client priority, a second served model name)
// and some hostile (a duplicate model, escaped "mod\u0065l", prompt or
// output-cap key; a member nested past 512 levels before a second model
// and prompt; input together with messages; background: true),
// Idempotency-Key retries, client disconnects at every stage
// (queued, prefill, decode), client deadlines, out-of-range parameters,
// admin clamps and budget changes, reloads that add a tenant, instance
// kill -9 (with and without restart), Redis reply loss (a proxy swallows the
// reply of a script that ran, so go-redis retries it), Redis stalls
// (SIGSTOP; one node of the Cluster), a tenant's Cluster slot moved to
// another node under traffic (as a resharding does it), and replica faults
// (connections cut mid-stream, SSE error events, errors before the stream,
// engine stalls). One seed in three runs replicas whose real batch (1) is
// below what the tenants' caps let Sluice send, at the default scrape
// cadences, after a burst of one tenant's streams: the batch is learned
// under all of the above, and what waits inside a replica is taken back
// into Sluice's queue (SCHEDULING §7).
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
//   - an attempt Sluice left at a replica and then sent again under the
//     same X-Request-Id, or answered 504 for a deadline before dispatch,
//     was taken back: a stream, before any event past its first output
//     (the chat role chunk and the first token's chunk leave together),
//     only where the batch is below what Sluice may send; it is not an
//     execution and is charged nothing (a stream whose client left after
//     Sluice did may have been either);
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
//   - a hostile body is answered 400 invalid_request, reaches no replica
//     and is neither admitted nor charged (the instances' audit trails);
//   - what a replica ran was admitted: each body it received, read as vLLM
//     reads it (the last of duplicate keys), names a model the tenant may
//     use and carries no priority and no background run, and the prompt
//     the replica counted is within the tenant's max_input_tokens and,
//     with the output, within the tokens held at its admission or grown
//     to (plus one step for a generation stopped at a budget);
//   - a block token budget's committed tokens stay within its limit plus
//     the documented overshoot: the abort allowance (one token per
//     unfinished choice of each request settled without a final usage)
//     and one hold-prediction step per request stopped at the budget
//     (LEDGER.md §12; the servers hold predictions with a floor of 8
//     tokens, so streamed generations grow their holds through the ledger);
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
