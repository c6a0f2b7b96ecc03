package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// OpenSource builds the telemetry source for mode and says in the log which
// one it uses. auto tries NVML and falls back to vLLM metrics with a
// one-line notice; nvml fails (wrapping [ErrUnavailable]) without a driver.
// It returns the mode actually in use. If the returned source is an
// *[NVML], the caller closes it after the [Monitor]'s Run returns.
func OpenSource(mode Mode, log *slog.Logger, now func() time.Time) (Source, Mode, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch mode {
	case ModeAuto, ModeNVML, "":
		n, err := OpenNVML(NVMLOptions{Now: now})
		if err == nil {
			log.Info("gpu telemetry: using NVML", "gpus", n.Count(), "driver", n.Driver())
			return n, ModeNVML, nil
		}
		if mode == ModeNVML || !errors.Is(err, ErrUnavailable) {
			return nil, ModeNVML, fmt.Errorf("gpu.telemetry nvml: %w", err)
		}
		log.Info("gpu telemetry: NVML not available, using vLLM metrics", "reason", err.Error())
		return NewVLLM(now), ModeVLLM, nil
	case ModeVLLM:
		log.Info("gpu telemetry: using vLLM metrics")
		return NewVLLM(now), ModeVLLM, nil
	case ModeOff:
		log.Info("gpu telemetry: off")
		return NewOff(now), ModeOff, nil
	}
	return nil, mode, fmt.Errorf("gpu.telemetry %q: must be auto, nvml, vllm or off", mode)
}
