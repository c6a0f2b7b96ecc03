package main

import (
	"github.com/sluicehq/sluice/internal/schematest"

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
		name  string
		args  []string
		want  string // in the first line
		usage bool   // the usage follows the error line
	}{
		{"no subcommand", []string{"bench"}, "sluice bench: missing command", true},
		{"unknown subcommand", []string{"bench", "frob"}, `unknown command "bench frob"`, true},
		{"bad flag", []string{"bench", "run", "--nope"}, "unknown flag --nope", true},
		{"stray arg", []string{"bench", "run", "extra"}, `unexpected argument "extra"`, true},
		{"save-result with a file", []string{"bench", "run", "--save-result", "out.json"},
			`sluice bench run: unexpected argument "out.json": --save-result is a switch, as in vllm bench serve: name the file with --result-dir DIR and --result-filename NAME`, true},
		{"save-result=file", []string{"bench", "sweep", "--save-result=out.json"},
			`sluice bench sweep: invalid boolean value "out.json" for --save-result: --save-result is a switch, as in vllm bench serve: name the file with --result-dir DIR and --result-filename NAME`, true},
		{"bad goodput", []string{"bench", "run", "--goodput", "ttft"}, "--goodput: want metric:ms", false},
		{"bad metric", []string{"bench", "run", "--percentile-metrics", "ttft,xyz"}, `unknown metric "xyz"`, false},
		{"bad rate", []string{"bench", "run", "--base-url", "http://127.0.0.1:1", "--request-rate", "fast"}, "--request-rate", false},
		{"no target", []string{"bench", "run"}, "--base-url is required", false},
		{"preset needs capacity", []string{"bench", "run", "--base-url", "http://127.0.0.1:1", "--workload", "flood"}, "needs --capacity", false},
		{"ab needs targets", []string{"bench", "ab", "--workload", "overhead", "--capacity", "4"}, "ab needs --a", false},
		{"sweep bad rates", []string{"bench", "sweep", "--rates", "2,x"}, `--rates: bad rate "x"`, false},
		{"compare one file", []string{"bench", "compare", "a.json"}, "compare needs two result files", false},
		{"request-rate with a workload", []string{"bench", "run", "--base-url", "http://127.0.0.1:1", "--workload", "flood", "--capacity", "4", "--request-rate", "10"},
			"sluice bench run: --request-rate does not apply with --workload", false},
		{"request-rate in a sweep", []string{"bench", "sweep", "--rates", "2,4", "--request-rate", "3"},
			"sluice bench sweep: --request-rate does not apply to a sweep", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, stderr := runCLI(t, "", tc.args...)
			assert.Equal(t, 2, code)
			first, rest, _ := strings.Cut(stderr, "\n")
			assert.Contains(t, first, tc.want)
			if tc.usage {
				assert.Empty(t, out)
				assert.True(t, strings.HasPrefix(rest, "usage: sluice bench"), "usage after the error: %q", stderr)
			} else {
				assert.Empty(t, rest, "one line: %q", stderr)
			}
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
		require.NoError(t, schematest.ValidateSchema(bench.ResultSchema, d))
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

// TestBenchSweepFiles: --result-dir is created when missing (a run is
// never lost to it), and each run's file names its rate and its index
// apart: rate 10, run 1 is rate10-run1, never rate101.
func TestBenchSweepFiles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "not", "yet")
	code, out, stderr := runCLI(t, "", "bench", "sweep", "--sim-replicas", "1", "--rates", "100,10", "--num-prompts", "4",
		"--random-input-len", "8", "--random-output-len", "2", "--progress", "0",
		"--save-result", "--result-dir", dir, "--result-filename", "s.json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "### rate 10 rps")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err, "the result directory was created")
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"s-rate100-run0.json", "s-rate10-run1.json"}, names)
	assert.NotContains(t, stderr+out, "empty chunk", "no warning about Sluice's or vLLM's own chunks")
}
