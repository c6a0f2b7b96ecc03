// Package bench is Sluice's load generator (`sluice bench`, BENCH.md): it
// drives open-loop, multi-tenant, streaming traffic at an OpenAI-compatible
// endpoint and reports vLLM-compatible latency and throughput, goodput,
// rejections by reason and fairness.
//
// # Layout
//
//   - [workload]: the workload file, validation and the seeded schedule
//     (per-tenant PCG streams: removing a tenant leaves the others'
//     traffic byte-identical).
//   - [loadgen]: the dispatcher (one goroutine per request, no pool), the
//     HTTP/1.1 client, the SSE reader and outcome classification.
//   - [stats]: vLLM's metric formulas, goodput, water-filled Jain's index,
//     maximum service difference.
//   - [report]: table, JSON (schema result.schema.json), CSV, JSONL, HTML and
//     A/B ratios.
//   - [scenarios]: the embedded presets.
//
// This package ties them together: [Run], [AB], [Sweep] and [Compare], the
// building blocks of `make bench` and `sluice demo`. Nothing imports bench
// except cmd/sluice.
//
// # Design rationale
//
// The schedule is fixed before t0 and latencies are also measured from the
// intended send time (coordinated omission, wrk2), so a lagging generator
// shows up as send lag and a warning rather than as flattering latencies.
package bench
