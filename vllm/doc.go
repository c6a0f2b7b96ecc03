// Package vllm is everything Sluice knows about vLLM: request parsing and
// rewriting, the upstream streaming client, usage tracking, response shaping
// for clients, /tokenize and /v1/models, and /metrics scraping. The facts it
// relies on are in docs VLLM.md Part 1; Part 2 is its contract.
//
// # Request path
//
// [Parse] reads only what admission needs from a /v1/chat/completions or
// /v1/completions body (model, stream, stream_options, n, the output cap,
// ignore_eos, min_tokens, priority, and the prompt or messages and tools for
// input counting) and keeps the body. Input tokens are counted in bytes mode
// at parse time (an upper bound for byte-level BPE, exact for token-id
// prompts; see [CountOptions]); [Client.Tokenize] gives exact counts.
// [Request.Plan] derives the output cap: min(client value or vLLM's default,
// tenant cap, budget cap), × n per prompt for the reservation.
// A cap cut from the bytes bound is flagged (Plan.BoundCut) so the
// scheduler counts exactly before relying on it; a chat request without a
// cap, exactly counted, keeps vLLM's own default (Plan.Default).
// [Request.Rewrite] produces the upstream body: every member byte for byte,
// except the cap fields, replaced so that vLLM enforces the approved cap; a
// streamed request's stream and stream_options are replaced so that vLLM
// streams with include_usage and continuous_usage_stats, and a non-streamed
// request stays non-streamed (vLLM's body then passes through).
//
// # Response path
//
// [Client.Stream] opens the upstream stream over HTTP/1.1; cancelling its
// context closes the connection, which vLLM takes as an abort. A
// non-streamed request's JSON answer is one Whole event. A request written
// to a keep-alive connection the replica had closed while idle is sent once
// more; idle connections expire before uvicorn's 5s.
//
// # The upstream connection
//
// Generation requests do not go through net/http's transport (h1.go): a
// request takes an idle keep-alive connection (or dials one), writes its
// head and body in one write, and reads the response head and body on the
// caller's goroutine; the body read to its end (Content-Length, or chunked
// to its last chunk and trailers) puts the connection back, and anything
// else closes it. context.AfterFunc aborts the request when its context
// ends: the connection's reads stop waiting (a read deadline in the past),
// the reader takes what the replica had already sent (a non-blocking recv:
// those chunks' usage is what the GPU ran, and on a loaded node the reader
// can lag by several), and the first read that finds nothing closes the
// connection, which is vLLM's abort signal; 5 ms after the abort it is
// closed whatever the reader does. A TLS connection closes at once.
// Stream.SettleFor reads those events before it computes an aborted
// stream's charge. net/http's transport runs a read and a
// write goroutine per connection and hands every request and response
// between them; on a loopback replica those hand-offs cost more CPU than the
// rest of Sluice's upstream path (docs/benchmarks/cpu-per-request.md).
//
// [Stream.Next]
// yields each SSE event with its raw bytes and parsed usage, and
// [Stream.Usage] always holds the best known usage: the final usage chunk if
// one arrived, else prompt + Σ over choices of the last cumulative
// completion_tokens. Nothing vLLM generated after the last chunk read is
// reported: [Stream.SettleFor] charges per prompt, with an allowance per
// unfinished choice of at least the stream interval seen, the cap where no
// usage evidence exists, and nothing for a request the engine refused
// before any output ([Stream.Refused]). [Shaper] (over [ShapeChunk]) strips
// the usage the streaming client did not ask for and restores vLLM's
// system_fingerprint; [Assembler] rebuilds vLLM's non-streamed body from
// chunks, or passes a Whole body through.
//
// # Errors
//
// Errors are classified by status, type and param, never by message:
// [*UpstreamError] for vLLM errors (non-200, or an SSE error event with
// InStream set), [ErrNotSent] when no byte reached the replica (safe to retry
// elsewhere), [ErrStreamCut] when the stream ended before [DONE] (502),
// [ErrInvalidRequest] / [*InvalidRequestError] for bad client bodies (400,
// naming the field), [ErrContextLength] for an exact prompt + cap over the
// context.
//
// # Scraping
//
// [ParseMetrics] reads the §1.7 metrics tolerantly (unknown series ignored, a
// missing metric unknown rather than zero, variants accepted, filtered by
// model_name, summed over engine; num_gpu_blocks is vLLM's data-parallel
// total, not summed again). [Poller] runs the scrape loop and
// publishes immutable [Replica] snapshots through an atomic pointer.
//
// # Bounds
//
// One SSE event is at most Config.MaxEventBytes; metrics lines over 64 KiB
// are skipped; JSON nesting deeper than 512 is malformed; per-choice usage
// tracking is bounded to 16384 choices. Parsers never panic (fuzzed).
package vllm
