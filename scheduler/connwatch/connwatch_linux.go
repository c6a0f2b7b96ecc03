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

	mu   sync.Mutex // guards regs, next
	regs map[uint64]reg
	next uint64
}

type reg struct {
	fd      int
	onClose func()
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
	return &Watcher{epfd: epfd, wakefd: wake, regs: make(map[uint64]reg)}, nil
}

// Watch calls onClose once, from the Run goroutine, when conn's peer closes
// or half-closes it or it errors. onClose must be quick and must not call
// stop. stop unregisters; it is idempotent, safe to race with the event, and
// safe after conn was closed (the watcher owns a duplicate descriptor).
func (w *Watcher) Watch(conn net.Conn, onClose func()) (stop func(), err error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, ErrUnsupported
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, ErrUnsupported
	}
	w.mu.Lock()
	w.next++
	id := w.next
	var ctlErr error
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
		w.regs[id] = reg{fd: dup, onClose: onClose}
	})
	w.mu.Unlock()
	if cerr != nil || ctlErr != nil {
		return nil, fmt.Errorf("connwatch: register: %w", errors.Join(cerr, ctlErr))
	}
	return func() { w.stop(id) }, nil
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
func (w *Watcher) forgetLocked(r reg) {
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, r.fd, nil)
	_ = unix.Close(r.fd)
}

// Watching returns the number of live registrations.
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
			r, ok := w.regs[id]
			if ok {
				delete(w.regs, id)
				w.forgetLocked(r)
			}
			w.mu.Unlock()
			if ok {
				r.onClose()
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
