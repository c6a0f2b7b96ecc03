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
// The fd is not dup'ed, so closing the connection removes it from the epoll
// set by itself. The hazard is fd reuse: if a registration outlived its
// connection, EPOLL_CTL_DEL could hit an unrelated connection that got the
// same number. Callers must therefore call stop before the connection is
// closed (a fasthttp handler does so before it returns; fasthttp closes or
// reuses the connection only after). Each registration carries a 64-bit
// generation in the event data, so a late event for a stopped registration
// finds nothing and is ignored.
package connwatch
