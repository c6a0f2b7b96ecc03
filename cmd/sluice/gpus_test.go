package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
)

// These tests replace the package-level openGPUs, so they do not run in
// parallel.

func TestGPUsWithoutNVMLPrintsOneLineAndExits1(t *testing.T) {
	old := openGPUs
	t.Cleanup(func() { openGPUs = old })
	openGPUs = func() (gpuReader, error) {
		return nil, fmt.Errorf("libnvidia-ml.so.1 not found: %w", gpu.ErrUnavailable)
	}
	for _, args := range [][]string{{"gpus"}, {"gpus", "--json"}} {
		code, out, errOut := runCLI(t, "", args...)
		assert.Equal(t, 1, code, "%v", args)
		assert.Empty(t, out)
		assert.Equal(t, "sluice gpus: NVML not available: libnvidia-ml.so.1 not found; no NVIDIA driver on this machine\n", errOut)
	}
}

// TestGPUsOnThisMachine uses the real loader; on a machine without the
// driver (CI) it must print the one-line notice, not crash.
func TestGPUsOnThisMachine(t *testing.T) {
	code, out, errOut := runCLI(t, "", "gpus")
	if code == 0 {
		t.Skipf("this machine has NVML:\n%s", out)
	}
	assert.Equal(t, 1, code)
	assert.Regexp(t, `^sluice gpus: NVML not available: .+; no NVIDIA driver on this machine\n$`, errOut)
}

func TestGPUsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"gpus", "--yaml"}, "sluice gpus: unknown flag --yaml\n"},
		{"stray argument", []string{"gpus", "0"}, "sluice gpus: unexpected argument \"0\"\n"},
		{"negative watch", []string{"gpus", "--watch", "-1s"}, "sluice gpus: --watch must be ≥ 0 and --interval > 0\n"},
		{"zero interval", []string{"gpus", "--watch", "1s", "--interval", "0s"}, "sluice gpus: --watch must be ≥ 0 and --interval > 0\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, "", tt.args...)
			assert.Equal(t, 2, code)
			assert.True(t, strings.HasPrefix(errOut, tt.want+"usage: sluice gpus"), "the error, then the usage: %q", errOut)
		})
	}
}

func TestGPUsFormatsUnknownFields(t *testing.T) {
	var b bytes.Buffer
	cfg := gpu.Config{}.WithDefaults()
	s := gpu.Sample{GPUs: []gpu.GPUStat{{Index: 0, UUID: "GPU-x", Name: "NVIDIA H200", Utilization: -1, TemperatureC: -1, PowerMilliwatts: -1}}}
	require.NoError(t, writeGPUsTable(&b, "", s, &cfg))
	assert.Equal(t, "driver , 1 GPU(s)\n"+
		"IDX  UUID   NAME         MEMORY USED/TOTAL  UTIL  TEMP  POWER  THROTTLE  HEALTH\n"+
		"0    GPU-x  NVIDIA H200  -                  -     -     -      -         healthy\n", b.String())
}
