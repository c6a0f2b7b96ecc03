//go:build cgo

package gpu

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func openFake(t *testing.T, every int) (*fakeNode, *NVML) {
	t.Helper()
	node := newFakeNode(t)
	src, err := NewNVML(node.srv, NVMLOptions{InventoryEvery: every, Now: func() time.Time { return t0 }})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, src.Close()) })
	return node, src
}

func TestNVMLInventoryDGXH100(t *testing.T) {
	t.Parallel()
	node, src := openFake(t, 10)
	assert.Equal(t, 8, src.Count())
	assert.Equal(t, "550.54.15", src.Driver())
	node.set(3, func(g *fakeGPU) { g.util, g.usedBytes, g.temp, g.powerMW = 87, 70<<30, 71, 612_345 })

	s, err := src.Poll(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "nvml", s.Source)
	assert.Equal(t, t0, s.At)
	require.Len(t, s.GPUs, 8)
	for i, g := range s.GPUs {
		assert.Equal(t, i, g.Index)
		assert.Equal(t, node.uuid(i), g.UUID)
		assert.Equal(t, "NVIDIA H100 80GB HBM3", g.Name)
		assert.Equal(t, uint64(81920)<<20, g.MemoryTotalBytes, "80 GiB")
		assert.True(t, g.ECCSupported)
	}
	g := s.GPUs[3]
	assert.InDelta(t, 0.87, g.Utilization, 1e-12)
	assert.Equal(t, uint64(70)<<30, g.MemoryUsedBytes)
	assert.Equal(t, 71, g.TemperatureC)
	assert.Equal(t, int64(612_345), g.PowerMilliwatts)
	assert.InDelta(t, 0.0, s.GPUs[0].Utilization, 0)
}

func TestNVMLThrottleReasonsAndAssessment(t *testing.T) {
	t.Parallel()
	cfg := Config{}.WithDefaults()
	tests := []struct {
		name    string
		reasons uint64
		want    State
		names   []string
	}{
		{"idle", ReasonGPUIdle, StateHealthy, []string{"idle"}},
		{"power cap is normal under load", ReasonSWPowerCap, StateHealthy, []string{"sw_power_cap"}},
		{"hw thermal", ReasonHWThermal, StateDegraded, []string{"hw_thermal"}},
		{"sw thermal and power brake", ReasonSWThermal | ReasonHWPowerBrake, StateDegraded, []string{"sw_thermal", "hw_power_brake"}},
		{"hw slowdown", ReasonHWSlowdown, StateDegraded, []string{"hw_slowdown"}},
	}
	node, src := openFake(t, 10)
	for _, tt := range tests {
		node.set(0, func(g *fakeGPU) { g.reasons = tt.reasons })
		s, err := src.Poll(context.Background())
		require.NoError(t, err)
		st, why := cfg.AssessGPU(s.GPUs[0], nil)
		assert.Equal(t, tt.reasons, s.GPUs[0].ClockEventReasons, tt.name)
		assert.Equal(t, tt.want, st, "%s: %s", tt.name, why)
		assert.Equal(t, tt.names, ReasonNames(s.GPUs[0].ClockEventReasons), tt.name)
	}
}

func TestNVMLXIDEventsReachTheirGPU(t *testing.T) {
	t.Parallel()
	node, src := openFake(t, 10)
	node.xid(5, 79)
	node.xid(5, 13)
	node.xid(2, 48)
	s, err := src.Poll(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []uint64{79, 13}, s.GPUs[5].XIDs)
	assert.Equal(t, []uint64{48}, s.GPUs[2].XIDs)
	assert.Empty(t, s.GPUs[0].XIDs)

	cfg := Config{}.WithDefaults()
	st, why := cfg.AssessGPU(s.GPUs[5], nil)
	assert.Equal(t, StateDraining, st)
	assert.Contains(t, why, "XID 79")

	s, err = src.Poll(context.Background())
	require.NoError(t, err)
	assert.Empty(t, s.GPUs[5].XIDs, "events are reported once")

	// An application XID alone (13: graphics engine exception) does not drain.
	st, _ = cfg.AssessGPU(GPUStat{UUID: "x", XIDs: []uint64{13}}, nil)
	assert.Equal(t, StateHealthy, st)
}

func TestNVMLECCAndRemapAreReadOnInventoryPolls(t *testing.T) {
	t.Parallel()
	node, src := openFake(t, 2)
	node.set(1, func(g *fakeGPU) { g.eccUnc, g.eccCorr, g.remapPending = 1, 7, true })
	s1, err := src.Poll(context.Background()) // poll 1: slow fields cached from open
	require.NoError(t, err)
	assert.Equal(t, uint64(0), s1.GPUs[1].ECCUncorrected, "slow fields not refreshed on poll 1")
	s2, err := src.Poll(context.Background()) // poll 2: refresh
	require.NoError(t, err)
	assert.Equal(t, uint64(1), s2.GPUs[1].ECCUncorrected)
	assert.Equal(t, uint64(7), s2.GPUs[1].ECCCorrected)
	assert.True(t, s2.GPUs[1].RemapPending)

	cfg := Config{}.WithDefaults()
	prev := s1.GPUs[1]
	cur := s2.GPUs[1]
	cur.RemapPending = false
	st, why := cfg.AssessGPU(cur, &prev)
	assert.Equal(t, StateDraining, st)
	assert.Equal(t, "GPU "+node.uuid(1)+" uncorrected ECC errors 0→1", why)
	cur.ECCUncorrected = 0
	st, why = cfg.AssessGPU(cur, &prev)
	assert.Equal(t, StateDegraded, st)
	assert.Contains(t, why, "corrected ECC errors rising 0→7")
}

func TestNVMLLostGPU(t *testing.T) {
	t.Parallel()
	node, src := openFake(t, 10)
	node.set(6, func(g *fakeGPU) { g.lost = true })
	s, err := src.Poll(context.Background())
	require.NoError(t, err)
	assert.True(t, s.GPUs[6].Lost)
	assert.False(t, s.GPUs[5].Lost)
	cfg := Config{}.WithDefaults()
	st, _ := cfg.AssessGPU(s.GPUs[6], nil)
	assert.Equal(t, StateDraining, st)
}

func TestNVMLInitFailureIsErrUnavailable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ret  nvml.Return
		want string
	}{
		{"no library", nvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found: NVML not available"},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED, "nvml init: ERROR_DRIVER_NOT_LOADED: NVML not available"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			node := newFakeNode(t)
			node.srv.InitFunc = func() nvml.Return { return tt.ret }
			_, err := NewNVML(node.srv, NVMLOptions{})
			require.ErrorIs(t, err, ErrUnavailable)
			assert.Equal(t, tt.want, err.Error())
		})
	}
}

// TestOpenNVMLWithoutDriver runs the real loader: on a machine without the
// NVIDIA driver it must return ErrUnavailable, not crash.
func TestOpenNVMLWithoutDriver(t *testing.T) {
	t.Parallel()
	n, err := OpenNVML(NVMLOptions{})
	if err == nil {
		t.Cleanup(func() { _ = n.Close() })
		t.Skipf("this machine has NVML (%d GPUs)", n.Count())
	}
	require.ErrorIs(t, err, ErrUnavailable)
}

func TestOpenSourceAutoFallsBack(t *testing.T) {
	t.Parallel()
	src, mode, err := OpenSource(ModeAuto, nil, nil)
	require.NoError(t, err)
	if mode == ModeNVML {
		t.Cleanup(func() { _ = src.(*NVML).Close() })
		t.Skip("this machine has NVML")
	}
	assert.Equal(t, ModeVLLM, mode)
	assert.IsType(t, &VLLM{}, src)

	_, _, err = OpenSource(ModeNVML, nil, nil)
	require.ErrorIs(t, err, ErrUnavailable)
	_, mode, err = OpenSource(ModeOff, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, ModeOff, mode)
	_, _, err = OpenSource("gpu-please", nil, nil)
	require.Error(t, err)
}
