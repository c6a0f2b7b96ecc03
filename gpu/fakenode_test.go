//go:build cgo

package gpu

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// fakeGPU is the mutable state behind one mock device.
type fakeGPU struct {
	util, temp, powerMW    uint32
	reasons                uint64
	eccCorr, eccUnc        uint64
	remapPending, remapBad bool
	usedBytes              uint64
	lost                   bool
	// Meters: utilisation samples queued by the test, and the
	// total-energy counter; noSamples/noEnergy make them unsupported.
	samples             []nvml.Sample
	energyMJ            uint64
	noSamples, noEnergy bool
}

// fakeNode is go-nvml's DGX H100 mock server (8 × H100 80GB) with the
// telemetry calls the mock leaves unset wired to per-GPU state that tests
// change, and an XID event queue.
type fakeNode struct {
	srv *server.Server

	mu     sync.Mutex // guards gpus' fields and events
	gpus   []*fakeGPU
	events []nvml.EventData
}

func newFakeNode(t testing.TB) *fakeNode {
	t.Helper()
	n := &fakeNode{srv: dgxh100.New()}
	for _, d := range n.srv.Devices {
		dev := d.(*server.Device)
		g := &fakeGPU{util: 0, temp: 40, powerMW: 100_000, usedBytes: 1 << 30}
		n.gpus = append(n.gpus, g)
		total := dev.MemoryInfo.Total
		guard := func(ret nvml.Return) nvml.Return {
			if g.lost {
				return nvml.ERROR_GPU_IS_LOST
			}
			return ret
		}
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			return nvml.Utilization{Gpu: g.util}, guard(nvml.SUCCESS)
		}
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			return nvml.Memory{Total: total, Used: g.usedBytes, Free: total - g.usedBytes}, guard(nvml.SUCCESS)
		}
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			return g.temp, guard(nvml.SUCCESS)
		}
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			return g.powerMW, guard(nvml.SUCCESS)
		}
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			return g.reasons, guard(nvml.SUCCESS)
		}
		dev.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
				return g.eccUnc, guard(nvml.SUCCESS)
			}
			return g.eccCorr, guard(nvml.SUCCESS)
		}
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			return 0, 0, g.remapPending, g.remapBad, guard(nvml.SUCCESS)
		}
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		dev.GetSamplesFunc = func(typ nvml.SamplingType, last uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if g.noSamples || typ != nvml.GPU_UTILIZATION_SAMPLES {
				return 0, nil, guard(nvml.ERROR_NOT_SUPPORTED)
			}
			var out []nvml.Sample
			for _, x := range g.samples {
				if x.TimeStamp > last {
					out = append(out, x)
				}
			}
			if len(out) == 0 {
				return nvml.VALUE_TYPE_UNSIGNED_INT, nil, guard(nvml.ERROR_NOT_FOUND) // as NVML: nothing new
			}
			return nvml.VALUE_TYPE_UNSIGNED_INT, out, guard(nvml.SUCCESS)
		}
		dev.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if g.noEnergy {
				return 0, guard(nvml.ERROR_NOT_SUPPORTED)
			}
			return g.energyMJ, guard(nvml.SUCCESS)
		}
	}
	n.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				n.mu.Lock()
				defer n.mu.Unlock()
				if len(n.events) == 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				ev := n.events[0]
				n.events = n.events[1:]
				return ev, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return n
}

// set changes GPU i's state under the node's lock.
func (n *fakeNode) set(i int, f func(g *fakeGPU)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n.gpus[i])
}

// xid queues a critical XID event on GPU i.
func (n *fakeNode) xid(i int, code uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, nvml.EventData{Device: n.srv.Devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: code})
}

// uuid returns GPU i's UUID.
func (n *fakeNode) uuid(i int) string { return n.srv.Devices[i].(*server.Device).UUID }

// sample queues a utilisation sample of pct percent at time at on GPU i.
func (n *fakeNode) sample(i int, at time.Time, pct uint32) {
	var v [8]byte
	binary.LittleEndian.PutUint32(v[:4], pct)
	n.set(i, func(g *fakeGPU) {
		g.samples = append(g.samples, nvml.Sample{TimeStamp: uint64(at.UnixMicro()), SampleValue: v})
	})
}
