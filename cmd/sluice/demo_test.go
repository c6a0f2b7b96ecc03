package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemoRunsAndReports: the demo sends the same load to the replicas
// directly and through Sluice and contrasts them in one table, in which
// the flood's excess is refused through Sluice and never directly; it
// prints no warning about its own load generator.
func TestDemoRunsAndReports(t *testing.T) {
	code, out, errOut := runCLI(t, "", "demo", "--duration", "3s")
	assert.Equal(t, 0, code, "stderr: %s", errOut)
	for _, want := range []string{"What each tenant got", "direct: ok/sent", "Sluice: ok/sent", "chat-a", "victims", "What Sluice counted"} {
		assert.Contains(t, out, want)
	}
	var flood string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "flood ") && strings.Contains(l, "|") {
			flood = l
		}
	}
	require.NotEmpty(t, flood, out)
	direct, through, _ := strings.Cut(flood, "|")
	assert.NotContains(t, direct, "queue_full", "nothing refuses the flood directly")
	assert.Contains(t, through, "queue_full=", "Sluice refuses the flood's excess: %s", flood)
	assert.NotContains(t, out, "WARNING", "no warnings about the demo's own client")
	assert.NotContains(t, out, "sk-demo-", "raw keys are never printed")
}

func TestDemoBadDuration(t *testing.T) {
	code, _, errOut := runCLI(t, "", "demo", "--duration", "-1s")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--duration must be")
}
