package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets script tests run this test binary as sluice: with
// SLUICE_TEST_AS_CLI=1 it runs the CLI on its arguments and exits
// (asCLIHook may first swap NVML for a mock).
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_AS_CLI") == "1" {
		if asCLIHook != nil {
			asCLIHook()
		}
		os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

var asCLIHook func()

// gpuCheck runs scripts/gpu-check.sh with this test binary as sluice.
func gpuCheck(t *testing.T, env ...string) (code int, stdout, stderr string) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("bash", "../../scripts/gpu-check.sh")
	cmd.Env = append(os.Environ(), append([]string{"SLUICE_BIN=" + exe, "SLUICE_TEST_AS_CLI=1"}, env...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errb.String()
}

// TestGPUCheckScriptWithoutNVML: on a machine without an NVIDIA driver the
// check stops at the inventory, says why, and exits 1.
func TestGPUCheckScriptWithoutNVML(t *testing.T) {
	code, out, errOut := gpuCheck(t)
	if code == 0 {
		t.Skipf("this machine has NVML:\n%s", out)
	}
	assert.Equal(t, 1, code)
	assert.Equal(t, "== inventory: sluice gpus --json\n", out)
	assert.Regexp(t, `^sluice gpus: NVML not available: .+; no NVIDIA driver on this machine\n`+
		`gpu-check: FAIL: NVML cannot be read \(exit 1\)\n$`, errOut)
}
