package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gpu"
)

// gpuWatch is what `sluice gpus --watch` saw: per-GPU figures over the
// watch and every health transition, judged poll to poll as the
// scheduler's monitor judges them (without its hysteresis, so that every
// change shows).
type gpuWatch struct {
	DurationS   float64           `json:"duration_s"`
	IntervalS   float64           `json:"interval_s"`
	Samples     int               `json:"samples"`
	GPUs        []gpuWatchGPU     `json:"gpus"`
	Transitions []gpuWatchHealthT `json:"transitions"`
}

// gpuWatchGPU is one GPU's figures over the watch; -1 means unknown (the
// device or driver does not report it).
type gpuWatchGPU struct {
	Index         int     `json:"index"`
	UUID          string  `json:"uuid"`
	UtilMean      float64 `json:"utilization_mean"`
	UtilMax       float64 `json:"utilization_max"`
	MemoryUsedMax int64   `json:"memory_used_max_bytes"`
	PowerMeanW    float64 `json:"power_mean_w"`
	PowerMaxW     float64 `json:"power_max_w"`
	EnergyJ       float64 `json:"energy_j"`
	BusyS         float64 `json:"busy_s"`
	Health        string  `json:"health"`

	utilN, powerN     int
	utilSum, powerSum float64
}

// gpuWatchHealthT is one GPU's health change between two polls.
type gpuWatchHealthT struct {
	AtS    float64 `json:"at_s"`
	Index  int     `json:"index"`
	UUID   string  `json:"uuid"`
	From   string  `json:"from"`
	To     string  `json:"to"`
	Reason string  `json:"reason,omitempty"`
}

// watchGPUs polls src every interval for d after the first sample and
// folds the samples into a gpuWatch. A failed poll ends the watch with its
// error: NVML that cannot be read is what the check is for.
func watchGPUs(ctx context.Context, src gpuReader, first gpu.Sample, d, interval time.Duration) (*gpuWatch, error) {
	cfg := gpu.Config{}.WithDefaults()
	w := &gpuWatch{IntervalS: interval.Seconds(), Samples: 1}
	byUUID := map[string]int{}
	prev := map[string]gpu.GPUStat{}
	state := map[string]gpu.State{}
	for _, g := range first.GPUs {
		byUUID[g.UUID] = len(w.GPUs)
		st, _ := cfg.AssessGPU(g, nil)
		state[g.UUID], prev[g.UUID] = st, g
		w.GPUs = append(w.GPUs, gpuWatchGPU{Index: g.Index, UUID: g.UUID, UtilMax: -1, MemoryUsedMax: -1, PowerMaxW: -1})
		w.GPUs[len(w.GPUs)-1].fold(g)
	}
	last := first
	t := time.NewTicker(interval)
	defer t.Stop()
	deadline := first.At.Add(d)
	for last.At.Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		s, err := src.Poll(ctx)
		if err != nil {
			return nil, err
		}
		w.Samples++
		for _, g := range s.GPUs {
			i, ok := byUUID[g.UUID]
			if !ok {
				continue // a GPU that appeared mid-watch: not in the inventory
			}
			w.GPUs[i].fold(g)
			p := prev[g.UUID]
			st, why := cfg.AssessGPU(g, &p)
			if st != state[g.UUID] {
				w.Transitions = append(w.Transitions, gpuWatchHealthT{AtS: s.At.Sub(first.At).Seconds(), Index: g.Index, UUID: g.UUID,
					From: state[g.UUID].String(), To: st.String(), Reason: why})
				state[g.UUID] = st
			}
			prev[g.UUID] = g
		}
		last = s
	}
	w.DurationS = last.At.Sub(first.At).Seconds()
	for i := range w.GPUs {
		g := &w.GPUs[i]
		f, l := findGPU(first, g.UUID), findGPU(last, g.UUID)
		g.EnergyJ, g.BusyS = -1, -1
		if f.EnergyMJ >= 0 && l.EnergyMJ >= f.EnergyMJ {
			g.EnergyJ = float64(l.EnergyMJ-f.EnergyMJ) / 1000
		}
		if f.BusyNs >= 0 && l.BusyNs >= f.BusyNs {
			g.BusyS = float64(l.BusyNs-f.BusyNs) / 1e9
		}
		g.UtilMean, g.PowerMeanW = -1, -1
		if g.utilN > 0 {
			g.UtilMean = g.utilSum / float64(g.utilN)
		}
		if g.powerN > 0 {
			g.PowerMeanW = g.powerSum / float64(g.powerN)
		}
		g.Health = state[g.UUID].String()
	}
	if w.Transitions == nil {
		w.Transitions = []gpuWatchHealthT{}
	}
	for _, g := range last.GPUs {
		if g.Lost {
			return nil, fmt.Errorf("GPU %d (%s) cannot be read: lost during the watch", g.Index, g.UUID)
		}
	}
	return w, nil
}

func findGPU(s gpu.Sample, uuid string) gpu.GPUStat {
	for _, g := range s.GPUs {
		if g.UUID == uuid {
			return g
		}
	}
	return gpu.GPUStat{BusyNs: -1, EnergyMJ: -1}
}

// fold adds one sample of the GPU.
func (g *gpuWatchGPU) fold(s gpu.GPUStat) {
	if s.Utilization >= 0 {
		g.utilN++
		g.utilSum += s.Utilization
		g.UtilMax = max(g.UtilMax, s.Utilization)
	}
	if s.MemoryTotalBytes > 0 {
		g.MemoryUsedMax = max(g.MemoryUsedMax, int64(s.MemoryUsedBytes))
	}
	if s.PowerMilliwatts >= 0 {
		w := float64(s.PowerMilliwatts) / 1000
		g.powerN++
		g.powerSum += w
		g.PowerMaxW = max(g.PowerMaxW, w)
	}
}

// writeTable prints the watch after the inventory table.
func (w *gpuWatch) writeTable(out io.Writer) error {
	fmt.Fprintf(out, "\nwatched %.1fs, %d samples every %s\n", w.DurationS, w.Samples, time.Duration(w.IntervalS*float64(time.Second)))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "IDX\tUUID\tUTIL MEAN/MAX\tMEMORY USED MAX\tPOWER MEAN/MAX\tENERGY\tBUSY\tHEALTH")
	pct := func(v float64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", v*100)
	}
	num := func(v float64, unit string) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%s", v, unit)
	}
	for _, g := range w.GPUs {
		mem := "-"
		if g.MemoryUsedMax >= 0 {
			mem = fmt.Sprintf("%d MiB", g.MemoryUsedMax>>20)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%s/%s\t%s\t%s\t%s\n", g.Index, g.UUID, pct(g.UtilMean), pct(g.UtilMax), mem,
			num(g.PowerMeanW, "W"), num(g.PowerMaxW, "W"), num(g.EnergyJ, " J"), num(g.BusyS, "s"), g.Health)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(w.Transitions) == 0 {
		_, err := fmt.Fprintln(out, "health transitions: none")
		return err
	}
	fmt.Fprintln(out, "health transitions:")
	for _, tr := range w.Transitions {
		line := fmt.Sprintf("  +%.1fs GPU %d: %s -> %s", tr.AtS, tr.Index, tr.From, tr.To)
		if tr.Reason != "" {
			line += " (" + tr.Reason + ")"
		}
		fmt.Fprintln(out, line)
	}
	return nil
}
