// Package connwatch turns a client's TCP close into a callback within
// milliseconds, without a goroutine per connection.
//
// fasthttp does not tell a handler that its client has gone
// (valyala/fasthttp#468, #965): RequestCtx.Done fires only at shutdown. A
// [Watcher] keeps one epoll set (Linux) of in-flight client connections,
// subscribed to EPOLLRDHUP only: HUP and ERR are always reported, and EPOLLIN
// is deliberately not watched, because a keep-alive or pipelining client may
// legitimately send its next request while the current one runs.
//
// # Design rationale
//
// Each registration watches a duplicate of the connection's descriptor that
// the watcher owns (F_DUPFD_CLOEXEC). The server may close the original, and
// the kernel hand its number to a new connection, before stop runs: a
// streaming response's writer goroutine can still be waiting upstream when
// fasthttp gives up on a vanished client. Deleting or closing the duplicate
// can never touch another connection. Each registration also carries a
// 64-bit generation in the event data, so a late event for a stopped
// registration finds nothing and is ignored. The duplicate holds the socket
// open until stop, which the caller runs as soon as the request ends.
//
// A per-connection Watcher ([NewPerConn], what the edge runs) keeps a
// connection's registration from its first request until the server closes
// it ([Watcher.Closed], from fasthttp's ConnState): a request only swaps the
// callback, with no system call, where a per-request registration costs a
// dup, two epoll_ctl calls and a close (about 3 µs; BenchmarkWatchStop vs
// BenchmarkWatchStopPerConn). The event is one-shot: a peer that closes
// between requests marks the registration gone, and the next request on it
// is told at once. The duplicate then holds the socket until Closed, so the
// server must report every close; the edge does.
package connwatch
