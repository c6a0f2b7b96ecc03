package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bench"
	"github.com/sluicehq/sluice/bench/report"
)

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no subcommand", []string{"bench"}, "bench needs a subcommand"},
		{"unknown subcommand", []string{"bench", "frob"}, `unknown bench subcommand "frob"`},
		{"bad flag", []string{"bench", "run", "--nope"}, "flag provided but not defined: -nope"},
		{"stray arg", []string{"bench", "run", "extra"}, `unexpected argument "extra"`},
		{"bad goodput", []string{"bench", "run", "--goodput", "ttft"}, "--goodput: want metric:ms"},
		{"bad metric", []string{"bench", "run", "--percentile-metrics", "ttft,xyz"}, `unknown metric "xyz"`},
		{"bad rate", []string{"bench", "run", "--base-url", "http://127.0.0.1:1", "--request-rate", "fast"}, "--request-rate"},
		{"no target", []string{"bench", "run"}, "--base-url is required"},
		{"preset needs capacity", []string{"bench", "run", "--base-url", "http://127.0.0.1:1", "--workload", "flood"}, "needs --capacity"},
		{"ab needs targets", []string{"bench", "ab", "--workload", "overhead", "--capacity", "4"}, "ab needs --a"},
		{"sweep bad rates", []string{"bench", "sweep", "--rates", "2,x"}, `--rates: bad rate "x"`},
		{"compare one file", []string{"bench", "compare", "a.json"}, "compare needs two result files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCLI(t, "", tc.args...)
			assert.Equal(t, 2, code)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

// TestBenchRunSimAndCompare runs `sluice bench run` against in-process
// simulated replicas twice, then compares the saved results.
func TestBenchRunSimAndCompare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := func(name string) []string {
		return []string{"bench", "run", "--sim-replicas", "2", "--num-prompts", "8", "--request-rate", "200",
			"--random-input-len", "8", "--random-output-len", "4", "--goodput", "ttft:5000", "--metric-percentiles", "50,99",
			"--progress", "0", "--save-result", "--result-dir", dir, "--result-filename", name, "--metadata", "queue_depth=4"}
	}
	code, out, stderr := runCLI(t, "", args("a.json")...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "Serving Benchmark Result")
	assert.Contains(t, out, "P50 TTFT (ms):")
	code, _, stderr = runCLI(t, "", args("b.json")...)
	require.Equal(t, 0, code, stderr)
	for _, n := range []string{"a.json", "b.json"} {
		d, err := report.Load(filepath.Join(dir, n))
		require.NoError(t, err)
		require.NoError(t, report.ValidateSchema(bench.ResultSchema, d))
		v, _ := d.F("completed")
		assert.InDelta(t, 8.0, v, 0)
		assert.Equal(t, "4", d.M("metadata")["queue_depth"])
	}
	code, out, stderr = runCLI(t, "", "bench", "compare", filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json"))
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "request_throughput")
	_, err := os.Stat(filepath.Join(dir, "a.json"))
	require.NoError(t, err)
}
