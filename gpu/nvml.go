//go:build cgo

package gpu

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLOptions configures an [NVML] source.
type NVMLOptions struct {
	// InventoryEvery: slow fields (name, memory total, ECC, row remapping)
	// are refreshed every InventoryEvery polls. Optional; default 10.
	InventoryEvery int
	// Now is the clock stamped on samples. Optional; default time.Now.
	Now func() time.Time
}

// NVML reads GPUs through NVIDIA's management library (go-nvml, which
// dlopens libnvidia-ml.so.1 at run time, so the binary starts on machines
// without a driver). Poll is safe for concurrent use (one mutex); Close
// must be called exactly once, after the last Poll.
type NVML struct {
	lib    nvml.Interface
	now    func() time.Time
	every  int
	driver string

	mu     sync.Mutex // guards devs, polls and events
	devs   []nvmlDev
	polls  int
	events nvml.EventSet // nil when no device supports XID events
}

type nvmlDev struct {
	d     nvml.Device
	uuid  string
	slow  GPUStat  // cached slow fields
	xids  []uint64 // pending XIDs since the previous poll
	index int

	// Meters (see GPUStat.BusyNs and EnergyMJ). samples: the device serves
	// utilisation samples, read from lastTs (µs) on; energy: it has the
	// total-energy counter. Otherwise busy and energy integrate utilisation
	// and power over poll intervals.
	samples, energy bool
	lastTs          uint64
	busyNs          int64
	energyMJ        int64 // the ∫ power dt fallback
	lastPoll        time.Time
}

const xidEventMask = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// OpenNVML loads the system's NVML library and enumerates its GPUs. Without
// a driver it returns an error wrapping [ErrUnavailable] whose text says why
// (never a panic or crash).
func OpenNVML(opts NVMLOptions) (*NVML, error) {
	return NewNVML(nvml.New(), opts)
}

// NewNVML initialises lib (the real library or a go-nvml mock such as
// pkg/nvml/mock/dgxh100) and enumerates its GPUs.
func NewNVML(lib nvml.Interface, opts NVMLOptions) (*NVML, error) {
	if opts.InventoryEvery <= 0 {
		opts.InventoryEvery = 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("libnvidia-ml.so.1 not found: %w", ErrUnavailable)
		}
		return nil, fmt.Errorf("nvml init: %s: %w", nvml.ErrorString(ret), ErrUnavailable)
	}
	n := &NVML{lib: lib, now: opts.Now, every: opts.InventoryEvery}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		n.driver = v
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("nvml device count: %s: %w", nvml.ErrorString(ret), ErrUnavailable)
	}
	for i := range count {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			// Keep the slot so indexes stay aligned; it reports as lost.
			n.devs = append(n.devs, nvmlDev{index: i, uuid: fmt.Sprintf("GPU-index-%d", i)})
			continue
		}
		dv := nvmlDev{d: d, index: i}
		dv.uuid, _ = d.GetUUID()
		n.devs = append(n.devs, dv)
	}
	n.registerEvents()
	for i := range n.devs {
		n.refreshSlow(&n.devs[i])
		n.probeMeters(&n.devs[i])
	}
	return n, nil
}

// probeMeters finds which busy and energy counters the device serves and
// takes their baseline: the samples already buffered are history.
func (n *NVML) probeMeters(dv *nvmlDev) {
	if dv.d == nil {
		return
	}
	if _, smp, ret := dv.d.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, 0); ret == nvml.SUCCESS || ret == nvml.ERROR_NOT_FOUND {
		dv.samples = true
		for _, x := range smp {
			dv.lastTs = max(dv.lastTs, x.TimeStamp)
		}
	}
	_, ret := dv.d.GetTotalEnergyConsumption()
	dv.energy = ret == nvml.SUCCESS
	dv.lastPoll = n.now()
}

// sampleValue decodes an NVML sample value of type vt as a float.
func sampleValue(vt nvml.ValueType, v [8]byte) float64 {
	switch vt {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.LittleEndian.Uint64(v[:]))
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(binary.LittleEndian.Uint64(v[:]))
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.LittleEndian.Uint64(v[:])))
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.LittleEndian.Uint32(v[:4])))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.LittleEndian.Uint16(v[:2]))
	}
	return float64(binary.LittleEndian.Uint32(v[:4]))
}

// readMeters advances the device's busy and energy meters to now (the
// sample's time) and stores them in s. Each utilisation sample is the
// percentage of its period (since the previous sample) in which a kernel
// ran, so its busy time is value/100 × period; a sample straddling two
// polls counts in the poll that reads it.
func (n *NVML) readMeters(dv *nvmlDev, s *GPUStat, now time.Time) {
	dt := now.Sub(dv.lastPoll)
	dv.lastPoll = now
	s.BusyNs, s.EnergyMJ = -1, -1
	if dv.samples {
		if vt, smp, ret := dv.d.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, dv.lastTs); ret == nvml.SUCCESS {
			slices.SortFunc(smp, func(a, b nvml.Sample) int { return cmp.Compare(a.TimeStamp, b.TimeStamp) })
			for _, x := range smp {
				if x.TimeStamp <= dv.lastTs {
					continue
				}
				if dv.lastTs > 0 {
					pct := min(max(sampleValue(vt, x.SampleValue), 0), 100)
					dv.busyNs += int64(math.Round(pct / 100 * float64(x.TimeStamp-dv.lastTs) * 1000))
				}
				dv.lastTs = x.TimeStamp
			}
		}
		s.BusyNs = dv.busyNs
	} else if s.Utilization >= 0 {
		if dt > 0 {
			dv.busyNs += int64(math.Round(s.Utilization * float64(dt)))
		}
		s.BusyNs = dv.busyNs
	}
	if dv.energy {
		if e, ret := dv.d.GetTotalEnergyConsumption(); ret == nvml.SUCCESS {
			s.EnergyMJ = int64(e)
		}
	} else if s.PowerMilliwatts >= 0 {
		if dt > 0 {
			dv.energyMJ += int64(math.Round(float64(s.PowerMilliwatts) * dt.Seconds()))
		}
		s.EnergyMJ = dv.energyMJ
	}
}

// registerEvents subscribes to XID and ECC events where supported; a
// machine or mock without event support simply reports no XIDs.
func (n *NVML) registerEvents() {
	set, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return
	}
	registered := 0
	for _, dv := range n.devs {
		if dv.d == nil {
			continue
		}
		sup, ret := dv.d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || sup&xidEventMask == 0 {
			continue
		}
		if dv.d.RegisterEvents(sup&xidEventMask, set) == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		_ = set.Free()
		return
	}
	n.events = set
}

// Driver returns the driver version ("" when unknown).
func (n *NVML) Driver() string { return n.driver }

// Count returns the number of GPUs found at open.
func (n *NVML) Count() int { return len(n.devs) }

// Close frees the event set and shuts NVML down. Call exactly once.
func (n *NVML) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.events != nil {
		_ = n.events.Free()
		n.events = nil
	}
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}

// Poll reads utilisation, memory used, temperature, power and clock-event
// reasons of every GPU, drains pending XID events, and every
// InventoryEvery polls refreshes the slow fields. A GPU whose reads fail
// with "GPU lost" is reported Lost; other unsupported fields read unknown.
func (n *NVML) Poll(ctx context.Context) (Sample, error) {
	if err := ctx.Err(); err != nil {
		return Sample{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.polls++
	if n.polls%n.every == 0 {
		for i := range n.devs {
			n.refreshSlow(&n.devs[i])
		}
	}
	n.drainEventsLocked()
	s := Sample{Source: string(ModeNVML), At: n.now(), GPUs: make([]GPUStat, len(n.devs))}
	for i := range n.devs {
		s.GPUs[i] = n.readFast(&n.devs[i], s.At)
	}
	return s, nil
}

// drainEventsLocked collects the XID events that arrived since the last poll
// without waiting (timeout 0). Caller holds mu.
func (n *NVML) drainEventsLocked() {
	if n.events == nil {
		return
	}
	for range 1024 { // bound the loop against a stuck driver
		ev, ret := n.events.Wait(0)
		if ret != nvml.SUCCESS {
			return
		}
		x := ev.EventData
		switch {
		case ev.EventType&nvml.EventTypeDoubleBitEccError != 0 && x == 0:
			x = 48 // DBE reported without an XID code
		case ev.EventType&nvml.EventTypeXidCriticalError == 0 && x == 0:
			continue // single-bit ECC: the counters show it
		}
		var uuid string
		if ev.Device != nil {
			uuid, _ = ev.Device.GetUUID()
		}
		for i := range n.devs {
			if n.devs[i].uuid == uuid {
				n.devs[i].xids = append(n.devs[i].xids, x)
			}
		}
	}
}

func lost(ret nvml.Return) bool {
	return ret == nvml.ERROR_GPU_IS_LOST || ret == nvml.ERROR_GPU_NOT_FOUND
}

// refreshSlow re-reads the fields that change rarely or cost more.
func (n *NVML) refreshSlow(dv *nvmlDev) {
	s := GPUStat{Index: dv.index, UUID: dv.uuid}
	if dv.d == nil {
		s.Lost = true
		dv.slow = s
		return
	}
	s.Name, _ = dv.d.GetName()
	if mem, ret := dv.d.GetMemoryInfo(); ret == nvml.SUCCESS {
		s.MemoryTotalBytes = mem.Total
	}
	unc, r1 := dv.d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	cor, r2 := dv.d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS {
		s.ECCSupported, s.ECCUncorrected, s.ECCCorrected = true, unc, cor
	}
	if _, _, pending, failed, ret := dv.d.GetRemappedRows(); ret == nvml.SUCCESS {
		s.RemapPending, s.RemapFailed = pending, failed
	} else if st, ret := dv.d.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS {
		s.RemapPending = st == nvml.FEATURE_ENABLED
	}
	s.Lost = lost(r1)
	dv.slow = s
}

// readFast reads the per-poll fields on top of the cached slow ones.
func (n *NVML) readFast(dv *nvmlDev, now time.Time) GPUStat {
	s := dv.slow
	s.Utilization, s.TemperatureC, s.PowerMilliwatts, s.BusyNs, s.EnergyMJ = -1, -1, -1, -1, -1
	if len(dv.xids) > 0 {
		s.XIDs = dv.xids
		dv.xids = nil
	}
	if dv.d == nil {
		return s
	}
	if u, ret := dv.d.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.Utilization = float64(min(u.Gpu, 100)) / 100
	} else if lost(ret) {
		s.Lost = true
		return s
	}
	if mem, ret := dv.d.GetMemoryInfo(); ret == nvml.SUCCESS {
		s.MemoryUsedBytes = mem.Used
		if s.MemoryTotalBytes == 0 {
			s.MemoryTotalBytes = mem.Total
		}
	}
	if t, ret := dv.d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		s.TemperatureC = int(t)
	}
	if p, ret := dv.d.GetPowerUsage(); ret == nvml.SUCCESS {
		s.PowerMilliwatts = int64(p)
	}
	if r, ret := dv.d.GetCurrentClocksEventReasons(); ret == nvml.SUCCESS {
		s.ClockEventReasons = r
	} else if r, ret := dv.d.GetCurrentClocksThrottleReasons(); ret == nvml.SUCCESS {
		s.ClockEventReasons = r
	}
	n.readMeters(dv, &s, now)
	return s
}
