package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gpu"
)

// gpuReader is what `sluice gpus` needs from *gpu.NVML.
type gpuReader interface {
	Poll(ctx context.Context) (gpu.Sample, error)
	Driver() string
	Close() error
}

// openGPUs opens NVML; tests replace it with go-nvml's mock.
var openGPUs = func() (gpuReader, error) {
	n, err := gpu.OpenNVML(gpu.NVMLOptions{})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// runGPUs implements `sluice gpus [--json] [--watch DUR [--interval DUR]]`:
// one NVML sample of the node's GPUs as a table (or JSON), with each GPU's
// health as the scheduler would judge it from this sample alone; with
// --watch, it then polls for DUR and reports utilisation, memory, power,
// energy and busy-time deltas and health transitions (gpuwatch.go). Without
// NVML it prints one line, "NVML not available: <reason>; no NVIDIA driver
// on this machine", and exits 1; so does a poll that fails.
func runGPUs(ctx context.Context, e env, args []string) error {
	fs := newFlags("gpus")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	watch := fs.Duration("watch", 0, "after the inventory, poll for this long and report deltas and health transitions (0: one sample)")
	every := fs.Duration("interval", time.Second, "poll interval of --watch")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *watch < 0 || (*watch > 0 && *every <= 0) {
		return flagError{usageError{errors.New("--watch must be ≥ 0 and --interval > 0")}, fs}
	}
	src, err := openGPUs()
	if err != nil {
		if errors.Is(err, gpu.ErrUnavailable) {
			reason := strings.TrimSuffix(err.Error(), ": "+gpu.ErrUnavailable.Error())
			return fmt.Errorf("%w: %s; no NVIDIA driver on this machine", gpu.ErrUnavailable, reason)
		}
		return err
	}
	s, err := src.Poll(ctx)
	var w *gpuWatch
	if err == nil && *watch > 0 {
		w, err = watchGPUs(ctx, src, s, *watch, *every)
	}
	cerr := src.Close()
	if err != nil {
		return fmt.Errorf("read GPUs: %w", err)
	}
	if cerr != nil {
		return cerr
	}
	cfg := gpu.Config{}.WithDefaults()
	if *asJSON {
		return writeGPUsJSON(e.stdout, src.Driver(), s, &cfg, w)
	}
	if err := writeGPUsTable(e.stdout, src.Driver(), s, &cfg); err != nil {
		return err
	}
	if w != nil {
		return w.writeTable(e.stdout)
	}
	return nil
}

// gpuHealth is a GPU's state and reason, without the "GPU <uuid> " prefix.
func gpuHealth(cfg *gpu.Config, g gpu.GPUStat) (gpu.State, string) {
	st, why := cfg.AssessGPU(g, nil)
	return st, strings.TrimPrefix(why, "GPU "+g.UUID+" ")
}

type gpuJSON struct {
	gpu.GPUStat
	ThrottleReasons []string `json:"throttle_reasons"`
	Health          string   `json:"health"`
	HealthReason    string   `json:"health_reason,omitempty"`
}

func writeGPUsJSON(w io.Writer, driver string, s gpu.Sample, cfg *gpu.Config, watch *gpuWatch) error {
	out := struct {
		Driver string    `json:"driver"`
		GPUs   []gpuJSON `json:"gpus"`
		Watch  *gpuWatch `json:"watch,omitempty"`
	}{Driver: driver, GPUs: make([]gpuJSON, 0, len(s.GPUs)), Watch: watch}
	for _, g := range s.GPUs {
		st, why := gpuHealth(cfg, g)
		r := gpu.ReasonNames(g.ClockEventReasons)
		if r == nil {
			r = []string{}
		}
		out.GPUs = append(out.GPUs, gpuJSON{GPUStat: g, ThrottleReasons: r, Health: st.String(), HealthReason: why})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeGPUsTable(w io.Writer, driver string, s gpu.Sample, cfg *gpu.Config) error {
	fmt.Fprintf(w, "driver %s, %d GPU(s)\n", driver, len(s.GPUs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "IDX\tUUID\tNAME\tMEMORY USED/TOTAL\tUTIL\tTEMP\tPOWER\tTHROTTLE\tHEALTH")
	for _, g := range s.GPUs {
		mem := "-"
		if g.MemoryTotalBytes > 0 {
			mem = fmt.Sprintf("%d/%d MiB", g.MemoryUsedBytes>>20, g.MemoryTotalBytes>>20)
		}
		util, temp, power := "-", "-", "-"
		if g.Utilization >= 0 {
			util = fmt.Sprintf("%.0f%%", g.Utilization*100)
		}
		if g.TemperatureC >= 0 {
			temp = fmt.Sprintf("%dC", g.TemperatureC)
		}
		if g.PowerMilliwatts >= 0 {
			power = fmt.Sprintf("%.0fW", float64(g.PowerMilliwatts)/1000)
		}
		throttle := strings.Join(gpu.ReasonNames(g.ClockEventReasons), ",")
		if throttle == "" {
			throttle = "-"
		}
		st, why := gpuHealth(cfg, g)
		health := st.String()
		if why != "" {
			health += ": " + why
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.UUID, g.Name, mem, util, temp, power, throttle, health)
	}
	return tw.Flush()
}
