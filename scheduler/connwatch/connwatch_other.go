//go:build !linux

package connwatch

import (
	"context"
	"errors"
	"net"
)

// ErrUnsupported: this platform has no watcher; callers fall back to
// write-failure detection (streams notice at their next write).
var ErrUnsupported = errors.New("connwatch: not supported on this platform")

// Watcher is a no-op outside Linux.
type Watcher struct{}

// New returns a Watcher whose Watch always reports ErrUnsupported.
func New() (*Watcher, error) { return &Watcher{}, nil }

// NewPerConn returns a Watcher whose Watch always reports ErrUnsupported.
func NewPerConn() (*Watcher, error) { return &Watcher{}, nil }

// Closed does nothing.
func (w *Watcher) Closed(net.Conn) {}

// Watch reports ErrUnsupported.
func (w *Watcher) Watch(net.Conn, func()) (func(), error) { return nil, ErrUnsupported }

// Watching returns 0.
func (w *Watcher) Watching() int { return 0 }

// Run waits for ctx.
func (w *Watcher) Run(ctx context.Context) error { <-ctx.Done(); return nil }

// Close does nothing.
func (w *Watcher) Close() error { return nil }
