//go:build cgo

package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
)

// mockNode returns go-nvml's DGX H100 mock with fixed UUIDs and the
// telemetry calls the mock leaves unset wired to fixed values; GPU 2 is
// thermally throttled and GPU 5 has a pending row remap.
func mockNode(t *testing.T) *server.Server {
	t.Helper()
	return newMockServer()
}

func newMockServer() *server.Server {
	srv := dgxh100.New()
	srv.Devices = srv.Devices[:6]
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.UUID = fmt.Sprintf("GPU-0000000%d-aaaa-bbbb-cccc-dddddddddddd", i)
		total := dev.MemoryInfo.Total
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i)}, nvml.SUCCESS
		}
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: total, Used: uint64(1024*(i+1)) << 20}, nvml.SUCCESS
		}
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(40 + i), nvml.SUCCESS }
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return uint32(100_000 + 50_000*i), nvml.SUCCESS }
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			if i == 2 {
				return gpu.ReasonHWThermal | gpu.ReasonSWPowerCap, nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		dev.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, i == 5, false, nvml.SUCCESS }
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			return 0, nil, nvml.ERROR_NOT_SUPPORTED
		}
		dev.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return uint64(1_000_000 * (i + 1)), nvml.SUCCESS }
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	return srv
}

func useMock(t *testing.T) {
	t.Helper()
	old := openGPUs
	t.Cleanup(func() { openGPUs = old })
	openGPUs = func() (gpuReader, error) {
		n, err := gpu.NewNVML(mockNode(t), gpu.NVMLOptions{})
		if err != nil {
			return nil, err
		}
		return n, nil
	}
}

func TestGPUsTableOnDGXH100Mock(t *testing.T) {
	useMock(t)
	code, out, errOut := runCLI(t, "", "gpus")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, `driver 550.54.15, 6 GPU(s)
IDX  UUID                                      NAME                   MEMORY USED/TOTAL  UTIL  TEMP  POWER  THROTTLE                 HEALTH
0    GPU-00000000-aaaa-bbbb-cccc-dddddddddddd  NVIDIA H100 80GB HBM3  1024/81920 MiB     0%    40C   100W   -                        healthy
1    GPU-00000001-aaaa-bbbb-cccc-dddddddddddd  NVIDIA H100 80GB HBM3  2048/81920 MiB     10%   41C   150W   -                        healthy
2    GPU-00000002-aaaa-bbbb-cccc-dddddddddddd  NVIDIA H100 80GB HBM3  3072/81920 MiB     20%   42C   200W   sw_power_cap,hw_thermal  degraded: throttled (hw_thermal)
3    GPU-00000003-aaaa-bbbb-cccc-dddddddddddd  NVIDIA H100 80GB HBM3  4096/81920 MiB     30%   43C   250W   -                        healthy
4    GPU-00000004-aaaa-bbbb-cccc-dddddddddddd  NVIDIA H100 80GB HBM3  5120/81920 MiB     40%   44C   300W   -                        healthy
5    GPU-00000005-aaaa-bbbb-cccc-dddddddddddd  NVIDIA H100 80GB HBM3  6144/81920 MiB     50%   45C   350W   -                        draining: row remap pending a reset
`, out)
}

func TestGPUsJSONOnDGXH100Mock(t *testing.T) {
	useMock(t)
	code, out, errOut := runCLI(t, "", "gpus", "--json")
	require.Equal(t, 0, code, errOut)
	var got struct {
		Driver string `json:"driver"`
		GPUs   []struct {
			Index           int      `json:"index"`
			UUID            string   `json:"uuid"`
			MemoryUsed      uint64   `json:"memory_used_bytes"`
			Utilization     float64  `json:"utilization"`
			PowerMW         int64    `json:"power_mw"`
			ThrottleReasons []string `json:"throttle_reasons"`
			Health          string   `json:"health"`
			HealthReason    string   `json:"health_reason"`
		} `json:"gpus"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, "550.54.15", got.Driver)
	require.Len(t, got.GPUs, 6)
	g := got.GPUs[2]
	assert.Equal(t, 2, g.Index)
	assert.Equal(t, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd", g.UUID)
	assert.Equal(t, uint64(3072)<<20, g.MemoryUsed)
	assert.InDelta(t, 0.2, g.Utilization, 1e-12)
	assert.Equal(t, int64(200_000), g.PowerMW)
	assert.Equal(t, []string{"sw_power_cap", "hw_thermal"}, g.ThrottleReasons)
	assert.Equal(t, "degraded", g.Health)
	assert.Equal(t, "throttled (hw_thermal)", g.HealthReason)
	assert.Equal(t, []string{}, got.GPUs[0].ThrottleReasons)
}
