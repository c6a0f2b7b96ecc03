package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDemoRunsAndReports(t *testing.T) {
	code, out, errOut := runCLI(t, "", "demo", "--duration", "2s")
	assert.Equal(t, 0, code, "stderr: %s", errOut)
	for _, want := range []string{"Serving Benchmark Result", "chat-a", "flood", "What Sluice counted"} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "sk-demo-", "raw keys are never printed")
}

func TestDemoBadDuration(t *testing.T) {
	code, _, errOut := runCLI(t, "", "demo", "--duration", "-1s")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--duration must be")
}
