//go:build linux

package connwatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is returned when the connection exposes no file descriptor (TLS wrappers,
// in-memory pipes). Callers fall back to write-failure detection.
var ErrUnsupported = errors.New("connwatch: connection has no watchable fd")

// Watcher watches client connections for a peer close. Safe for concurrent
// use; Run must be running for callbacks to fire.
type Watcher struct {
	epfd   int
	wakefd int // eventfd that interrupts epoll_wait on shutdown

	mu   sync.Mutex // guards regs, next, conns
	regs map[uint64]*reg
	next uint64

	// perConn: registrations live until Closed (NewPerConn); conns finds
	// a connection's registration.
	perConn bool
	conns   map[net.Conn]*reg
}

type reg struct {
	id      uint64
	fd      int
	onClose func() // nil between requests (per connection)
	conn    net.Conn
	req     uint64 // the current request's number (per connection)
	gone    bool   // the peer's close was seen (per connection)
}

// NewPerConn creates a Watcher whose registrations last as long as the
// connection: the first Watch of a connection adds it to the epoll set,
// later ones only swap the callback, and the server must call Closed when
// it closes the connection (fasthttp's ConnState StateClosed). That saves
// four system calls per request on a kept-alive connection (dup, epoll_ctl
// add and del, close).
func NewPerConn() (*Watcher, error) {
	w, err := New()
	if err != nil {
		return nil, err
	}
	w.perConn = true
	w.conns = make(map[net.Conn]*reg)
	return w, nil
}

// New creates a Watcher. Close releases its descriptors after Run returns.
func New() (*Watcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("connwatch: epoll_create1: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connwatch: eventfd: %w", err), unix.Close(epfd))
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setID(&ev, 0) // generation 0 is the wake fd
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		return nil, errors.Join(fmt.Errorf("connwatch: epoll_ctl wake: %w", err), unix.Close(epfd), unix.Close(wake))
	}
	return &Watcher{epfd: epfd, wakefd: wake, regs: make(map[uint64]*reg)}, nil
}

// Watch calls onClose once, from the Run goroutine, when conn's peer closes
// or half-closes it or it errors. onClose must be quick and must not call
// stop. stop unregisters; it is idempotent, safe to race with the event, and
// safe after conn was closed (the watcher owns a duplicate descriptor).
//
// On a per-connection Watcher (NewPerConn) the registration outlives stop,
// until Closed; a connection whose peer closed while no request was
// watching it calls onClose at once, from Watch.
func (w *Watcher) Watch(conn net.Conn, onClose func()) (stop func(), err error) {
	if w.perConn {
		w.mu.Lock()
		if r := w.conns[conn]; r != nil {
			if r.gone {
				w.mu.Unlock()
				onClose()
				return func() {}, nil
			}
			r.req++
			r.onClose = onClose
			n := r.req
			w.mu.Unlock()
			return func() { w.done(r, n) }, nil
		}
		w.mu.Unlock()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, ErrUnsupported
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, ErrUnsupported
	}
	w.mu.Lock()
	if w.perConn && w.conns[conn] != nil {
		// Another request of the connection registered it meanwhile
		// (HTTP/1.1 has one at a time; this is only for safety).
		w.mu.Unlock()
		return w.Watch(conn, onClose)
	}
	w.next++
	id := w.next
	var ctlErr error
	var r *reg
	cerr := raw.Control(func(fd uintptr) {
		// Watch a duplicate we own: the server may close (and the kernel
		// reuse) the original fd before stop runs, e.g. when a streaming
		// client leaves while its writer goroutine still waits upstream.
		dup, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			ctlErr = err
			return
		}
		ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLONESHOT}
		setID(&ev, id)
		if ctlErr = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, dup, &ev); ctlErr != nil {
			_ = unix.Close(dup)
			return
		}
		r = &reg{id: id, fd: dup, onClose: onClose}
		w.regs[id] = r
		if w.perConn {
			r.conn, r.req = conn, 1
			w.conns[conn] = r
		}
	})
	w.mu.Unlock()
	if cerr != nil || ctlErr != nil {
		return nil, fmt.Errorf("connwatch: register: %w", errors.Join(cerr, ctlErr))
	}
	if w.perConn {
		return func() { w.done(r, 1) }, nil
	}
	return func() { w.stop(id) }, nil
}

// done ends request n's watch of a per-connection registration.
func (w *Watcher) done(r *reg, n uint64) {
	w.mu.Lock()
	if r.req == n {
		r.onClose = nil
	}
	w.mu.Unlock()
}

// Closed unregisters a connection the server closed (per-connection
// Watcher; a no-op otherwise). A request still watching it is told, as if
// the peer had closed: nothing more can reach its client.
func (w *Watcher) Closed(conn net.Conn) {
	if !w.perConn {
		return
	}
	w.mu.Lock()
	r := w.conns[conn]
	var cb func()
	if r != nil {
		delete(w.conns, conn)
		delete(w.regs, r.id)
		cb, r.onClose = r.onClose, nil
		r.gone = true
		w.forgetLocked(r)
	}
	w.mu.Unlock()
	if cb != nil {
		cb()
	}
}

func (w *Watcher) stop(id uint64) {
	w.mu.Lock()
	r, ok := w.regs[id]
	if ok {
		delete(w.regs, id)
		w.forgetLocked(r)
	}
	w.mu.Unlock()
}

// forgetLocked drops a registration's epoll entry and closes its duplicate
// descriptor (w.mu held). The duplicate is ours alone, so neither call can
// touch another connection.
func (w *Watcher) forgetLocked(r *reg) {
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, r.fd, nil)
	_ = unix.Close(r.fd)
}

// Watching returns the number of live registrations (connections, on a
// per-connection Watcher).
func (w *Watcher) Watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.regs)
}

// Run delivers close events until ctx ends. Call it once.
func (w *Watcher) Run(ctx context.Context) error {
	done := make(chan struct{})
	defer close(done)
	go func() { // joined: exits when Run returns
		select {
		case <-ctx.Done():
			var one = [8]byte{1}
			_, _ = unix.Write(w.wakefd, one[:])
		case <-done:
		}
	}()
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("connwatch: epoll_wait: %w", err)
		}
		for i := range n {
			id := getID(&events[i])
			if id == 0 {
				return nil // woken for shutdown
			}
			w.mu.Lock()
			var cb func()
			if r, ok := w.regs[id]; ok && w.perConn {
				// Disarmed (one-shot); unregistered at Closed.
				r.gone = true
				cb, r.onClose = r.onClose, nil
			} else if ok {
				delete(w.regs, id)
				w.forgetLocked(r)
				cb = r.onClose
			}
			w.mu.Unlock()
			if cb != nil {
				cb()
			}
		}
	}
}

// Close releases the epoll and wake descriptors and any registration left.
// Call after Run returned.
func (w *Watcher) Close() error {
	w.mu.Lock()
	for id, r := range w.regs {
		delete(w.regs, id)
		w.forgetLocked(r)
	}
	clear(w.conns)
	w.mu.Unlock()
	return errors.Join(unix.Close(w.epfd), unix.Close(w.wakefd))
}

// The 64-bit generation travels in the event's Fd and Pad words.
func setID(ev *unix.EpollEvent, id uint64) {
	ev.Fd = int32(uint32(id))
	ev.Pad = int32(uint32(id >> 32))
}

func getID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}
