//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// stubLib and stubDev are a minimal allocation-free NVML for benchmarks:
// go-nvml's generated mocks record every call (appending to slices), which
// would dominate the figures. They measure Sluice's own cost per poll; the
// real driver's calls (ioctls, roughly microseconds each) come on top.
type stubLib struct {
	nvml.Interface
	devs []nvml.Device
}

func (s *stubLib) Init() nvml.Return                             { return nvml.SUCCESS }
func (s *stubLib) Shutdown() nvml.Return                         { return nvml.SUCCESS }
func (s *stubLib) SystemGetDriverVersion() (string, nvml.Return) { return "stub", nvml.SUCCESS }
func (s *stubLib) DeviceGetCount() (int, nvml.Return)            { return len(s.devs), nvml.SUCCESS }
func (s *stubLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return s.devs[i], nvml.SUCCESS
}
func (s *stubLib) EventSetCreate() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }

type stubDev struct {
	nvml.Device
	uuid string
	ts   uint64 // utilisation sample clock, µs
	one  [1]nvml.Sample
}

func (d *stubDev) GetUUID() (string, nvml.Return) { return d.uuid, nvml.SUCCESS }
func (d *stubDev) GetName() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3", nvml.SUCCESS }
func (d *stubDev) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	return nvml.Memory{Total: 80 << 30, Used: 70 << 30}, nvml.SUCCESS
}
func (d *stubDev) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	return nvml.Utilization{Gpu: 87}, nvml.SUCCESS
}
func (d *stubDev) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	return 60, nvml.SUCCESS
}
func (d *stubDev) GetPowerUsage() (uint32, nvml.Return)                { return 500_000, nvml.SUCCESS }
func (d *stubDev) GetCurrentClocksEventReasons() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
func (d *stubDev) GetTotalEccErrors(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
	return 0, nvml.SUCCESS
}
func (d *stubDev) GetRemappedRows() (int, int, bool, bool, nvml.Return) {
	return 0, 0, false, false, nvml.SUCCESS
}
func (d *stubDev) GetSupportedEventTypes() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }

// GetSamples returns one new 87 % sample per call, from a fixed array.
func (d *stubDev) GetSamples(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	d.ts += 100_000
	d.one[0] = nvml.Sample{TimeStamp: d.ts, SampleValue: [8]byte{87}}
	return nvml.VALUE_TYPE_UNSIGNED_INT, d.one[:], nvml.SUCCESS
}
func (d *stubDev) GetTotalEnergyConsumption() (uint64, nvml.Return) { return d.ts * 50, nvml.SUCCESS }

func stubNode(n int) *stubLib {
	l := &stubLib{}
	for i := range n {
		l.devs = append(l.devs, &stubDev{uuid: fmt.Sprintf("GPU-%08d", i)})
	}
	return l
}

// BenchmarkNVMLPoll is one poll of an 8-GPU node (default inventory_every
// 10, so slow fields are amortised). ns/GPU-poll × 10 polls/s is the CPU
// cost per GPU per second at the default 100 ms interval, excluding the
// driver's own time.
func BenchmarkNVMLPoll(b *testing.B) {
	src, err := NewNVML(stubNode(8), NVMLOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := src.Poll(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/8, "ns/GPU-poll")
}

// BenchmarkMonitorStepNVML is poll + evaluation of 8 single-GPU replicas
// on the stub node: the full per-poll cost of GPU awareness.
func BenchmarkMonitorStepNVML(b *testing.B) {
	src, err := NewNVML(stubNode(8), NVMLOptions{})
	if err != nil {
		b.Fatal(err)
	}
	reps := make([]Replica, 8)
	for i := range reps {
		reps[i] = Replica{Name: "r" + strconv.Itoa(i), GPUs: []string{fmt.Sprintf("GPU-%08d", i)}, CapacityTokens: 1000}
	}
	m, err := NewMonitor(Config{Replicas: reps}, Deps{Source: src, Now: time.Now})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.step(ctx)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/8, "ns/GPU-poll")
}
