//go:build cgo

package main

import (
	"encoding/json"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
)

// useWatchMock is mockNode with time: each GPU's energy counter grows at
// its power draw, GPU 3 starts thermal throttling 10 s in, and GPU 5 is
// lost 20 s in when lose is set. Call inside a synctest bubble.
func useWatchMock(t *testing.T, lose bool) {
	t.Helper()
	old := openGPUs
	t.Cleanup(func() { openGPUs = old })
	openGPUs = func() (gpuReader, error) {
		srv := mockNode(t)
		start := time.Now()
		for i, d := range srv.Devices {
			dev := d.(*server.Device)
			mw := uint64(100_000 + 50_000*i)
			dev.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
				return 1_000_000 + mw*uint64(time.Since(start).Milliseconds())/1000, nvml.SUCCESS
			}
			if i == 3 {
				dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
					if time.Since(start) >= 10*time.Second {
						return gpu.ReasonHWThermal, nvml.SUCCESS
					}
					return 0, nvml.SUCCESS
				}
			}
			if i == 5 && lose {
				util := dev.GetUtilizationRatesFunc
				dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
					if time.Since(start) >= 20*time.Second {
						return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST
					}
					return util()
				}
			}
		}
		n, err := gpu.NewNVML(srv, gpu.NVMLOptions{})
		if err != nil {
			return nil, err
		}
		return n, nil
	}
}

// TestGPUsWatchOnDGXH100Mock: a 30 s watch (fake time) reports the
// samples, utilisation, memory, power, energy and busy deltas per GPU,
// and GPU 3's health transition when it starts throttling.
func TestGPUsWatchOnDGXH100Mock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		useWatchMock(t, false)
		code, out, errOut := runCLI(t, "", "gpus", "--watch", "30s", "--json")
		require.Equal(t, 0, code, errOut)
		var got struct {
			GPUs  []map[string]any `json:"gpus"`
			Watch gpuWatch         `json:"watch"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		require.Len(t, got.GPUs, 6, "the inventory first")
		w := got.Watch
		assert.InDelta(t, 30.0, w.DurationS, 0)
		assert.Equal(t, 31, w.Samples, "the inventory sample + one a second")
		require.Len(t, w.GPUs, 6)
		g1 := w.GPUs[1]
		assert.InDelta(t, 0.1, g1.UtilMean, 1e-12)
		assert.InDelta(t, 0.1, g1.UtilMax, 1e-12)
		assert.Equal(t, int64(2048)<<20, g1.MemoryUsedMax)
		assert.InDelta(t, 150.0, g1.PowerMeanW, 1e-9)
		assert.InDelta(t, 4500.0, g1.EnergyJ, 1e-9, "150 W × 30 s from the energy counter")
		assert.InDelta(t, 3.0, g1.BusyS, 1e-9, "10 % of 30 s")
		assert.Equal(t, "degraded", w.GPUs[3].Health)
		assert.Equal(t, []gpuWatchHealthT{{AtS: 10, Index: 3, UUID: "GPU-00000003-aaaa-bbbb-cccc-dddddddddddd",
			From: "healthy", To: "degraded", Reason: "GPU GPU-00000003-aaaa-bbbb-cccc-dddddddddddd throttled (hw_thermal)"}}, w.Transitions)
	})
}

// TestGPUsWatchTable: the table form ends with the watch summary.
func TestGPUsWatchTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		useWatchMock(t, false)
		code, out, errOut := runCLI(t, "", "gpus", "--watch", "2s", "--interval", "500ms")
		require.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "\nwatched 2.0s, 5 samples every 500ms\n")
		assert.Contains(t, out, "1    GPU-00000001-aaaa-bbbb-cccc-dddddddddddd  10%/10%        2048 MiB         150.0W/150.0W   300.0 J  0.2s  healthy\n")
		assert.Contains(t, out, "health transitions: none\n")
	})
}

// TestGPUsWatchFailsWhenAGPUIsLost: a GPU lost during the watch makes the
// check fail (exit 1), naming it.
func TestGPUsWatchFailsWhenAGPUIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		useWatchMock(t, true)
		code, out, errOut := runCLI(t, "", "gpus", "--watch", "30s")
		assert.Equal(t, 1, code)
		assert.Empty(t, out)
		assert.Equal(t, "sluice gpus: read GPUs: GPU 5 (GPU-00000005-aaaa-bbbb-cccc-dddddddddddd) cannot be read: lost during the watch\n", errOut)
	})
}

func init() {
	asCLIHook = func() {
		if os.Getenv("SLUICE_TEST_MOCK_NVML") != "1" {
			return
		}
		openGPUs = func() (gpuReader, error) {
			n, err := gpu.NewNVML(newMockServer(), gpu.NVMLOptions{})
			if err != nil {
				return nil, err
			}
			return n, nil
		}
	}
}

// TestGPUCheckScriptOnDGXH100Mock: the whole check against go-nvml's mock
// (a 2 s watch in real time): inventory JSON, the watch table, OK.
func TestGPUCheckScriptOnDGXH100Mock(t *testing.T) {
	code, out, errOut := gpuCheck(t, "SLUICE_TEST_MOCK_NVML=1", "GPU_CHECK_DURATION=2s", "GPU_CHECK_INTERVAL=500ms")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "== inventory: sluice gpus --json\n{\n  \"driver\": \"550.54.15\",")
	assert.Contains(t, out, "== NVML telemetry for 2s: sluice gpus --watch 2s --interval 500ms\n")
	assert.Regexp(t, `watched 2\.\ds, \d+ samples every 500ms\n`, out)
	assert.Contains(t, out, "health transitions: none\ngpu-check: OK\n")
	assert.Empty(t, errOut)
}
