//go:build !cgo

package gpu

import (
	"context"
	"fmt"
	"time"
)

// NVMLOptions configures an [NVML] source.
type NVMLOptions struct {
	InventoryEvery int
	Now            func() time.Time
}

// NVML is unavailable in binaries built without cgo (go-nvml needs it).
type NVML struct{}

// OpenNVML always fails with [ErrUnavailable] in a build without cgo.
func OpenNVML(NVMLOptions) (*NVML, error) {
	return nil, fmt.Errorf("binary built without cgo: %w", ErrUnavailable)
}

// Driver returns "".
func (*NVML) Driver() string { return "" }

// Count returns 0.
func (*NVML) Count() int { return 0 }

// Close does nothing.
func (*NVML) Close() error { return nil }

// Poll fails with [ErrUnavailable].
func (*NVML) Poll(context.Context) (Sample, error) { return Sample{}, ErrUnavailable }
