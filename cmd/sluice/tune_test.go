package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
)

// sweepFixture writes three saved results shaped like a saturation sweep
// (the fields tune reads, as bench/report writes them): below the knee, at
// it, and beyond it.
func sweepFixture(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	runs := []struct {
		sent, served, goodput, p50, conc, maxConc float64
	}{
		{6.2, 6.1, 6.0, 45, 16, 24},
		{12.4, 11.8, 11.5, 300, 31, 32},
		{18.6, 12.0, 9.0, 2500, 32, 32},
	}
	var paths []string
	for i, r := range runs {
		// A 10 s measured window: good counts are goodput × 10.
		doc := map[string]any{
			"request_throughput": r.served, "good": r.goodput * 10, "median_ttft_ms": r.p50,
			"window":   map[string]any{"start_s": 2, "end_s": 12},
			"schedule": map[string]any{"sent_rate": r.sent},
			"tenants": map[string]any{"solo": map[string]any{
				"good": r.goodput * 10, "offered_rate": r.sent, "concurrency": r.conc, "max_concurrent_requests": r.maxConc}},
		}
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		p := filepath.Join(dir, "rate"+string(rune('a'+i))+".json")
		require.NoError(t, os.WriteFile(p, b, 0o600))
		paths = append(paths, p)
	}
	return paths
}

// TestTuneLittlesLaw: the knee is the run that served the most requests in
// time (115 in its 10 s window at 12.4 offered: 11.5 req/s); the wait the
// 2 s SLO allows is 2 s − 45 ms (lightest run's median TTFT), truncated to
// 1.9 s; depth = ⌈11.5 × 1.9⌉ = 22; attainment is predicted as
// min(1, 11.5 / offered) per measured rate.
func TestTuneLittlesLaw(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", append([]string{"tune", "--slo-ttft", "2s"}, sweepFixture(t)...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "  - name: solo\n    queue: {max_wait: 1.9s, max_depth: 22}\n")
	assert.Contains(t, out, "# max_wait 1.9s: SLO TTFT 2s - unqueued median TTFT 45ms")
	assert.Contains(t, out, "# max_depth 22: Little's law: 11.50 req/s served in time at the knee x 1.9s acceptable wait")
	assert.Contains(t, out, "predicted SLO attainment at 18.60 req/s offered: 61.8%")
	assert.Contains(t, out, "predicted SLO attainment at 6.20 req/s offered: 100.0%")
	assert.NotContains(t, out, "concurrency:", "no limit unless asked")

	code, out, errOut = runCLI(t, "", append([]string{"tune", "--limit"}, sweepFixture(t)...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "    concurrency: 32\n")
}

// TestTuneConfigPassesConfigCheck: the recommendations applied to a config
// pass `sluice config check`, and the file holds exactly those values.
func TestTuneConfigPassesConfigCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := filepath.Join(dir, "sluice.yaml")
	tuned := filepath.Join(dir, "tuned.yaml")
	require.NoError(t, os.WriteFile(base, []byte("upstream: {replicas: [{url: \"http://127.0.0.1:8100\", max_num_seqs: 32}]}\n"+
		"tenants:\n  - {name: solo, weight: 2, api_keys: [\""+config.HashKey("sk-solo")+"\"], queue: {order: edf}}\n"+
		"  - {name: other, api_keys: [\""+config.HashKey("sk-other")+"\"]}\n"), 0o600))
	code, out, errOut := runCLI(t, "", append([]string{"tune", "--limit", "--config", base, "--out", tuned}, sweepFixture(t)...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "# checked: "+base)

	code, out, errOut = runCLI(t, "", "config", "check", tuned)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "ok (2 tenants")
	f, err := config.Load(tuned)
	require.NoError(t, err)
	solo, other := f.Tenants[0], f.Tenants[1]
	assert.Equal(t, "solo", solo.Name)
	assert.Equal(t, 1900*time.Millisecond, solo.Queue.MaxWait)
	assert.Equal(t, 22, solo.Queue.MaxDepth)
	assert.Equal(t, 32, solo.Concurrency)
	assert.Equal(t, 2, solo.Weight, "other settings are kept")
	assert.Equal(t, "edf", solo.Queue.Order)
	assert.Equal(t, 0, other.Concurrency, "tenants not in the results are left alone")
	assert.Equal(t, 10*time.Second, other.Queue.MaxWait)
}

func TestTuneBadInput(t *testing.T) {
	t.Parallel()
	runs := sweepFixture(t)
	missing := filepath.Join(t.TempDir(), "none.yaml")
	noTenant := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(noTenant, []byte("upstream: {replicas: [{url: \"http://127.0.0.1:8100\"}]}\n"+
		"tenants: [{name: a, api_keys: [\""+config.HashKey("sk-a")+"\"]}]\n"), 0o600))
	notResult := filepath.Join(t.TempDir(), "x.json")
	// (no good count, no window)
	require.NoError(t, os.WriteFile(notResult, []byte(`{"tenants": {}}`), 0o600))
	tests := []struct {
		name   string
		args   []string
		errHas string
	}{
		{"no results", []string{"tune"}, "tune needs saved bench results"},
		{"slo too tight", append([]string{"tune", "--slo-ttft", "100ms"}, runs...), "leaves no queue wait"},
		{"bad slo", append([]string{"tune", "--slo-ttft", "-1s"}, runs...), "--slo-ttft must be > 0"},
		{"not a result", []string{"tune", notResult}, "not a bench result"},
		{"no such file", []string{"tune", missing}, "load result"},
		{"tenant not in config", append([]string{"tune", "--config", noTenant}, runs...), `no tenant "solo" in the config`},
		{"out without config", append([]string{"tune", "--out", missing}, runs...), "--out needs --config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, _, errOut := runCLI(t, "", tt.args...)
			assert.Equal(t, 2, code)
			assert.Contains(t, errOut, tt.errHas)
		})
	}
}

func TestTuneHelp(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "", "tune", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "usage: sluice tune")
	assert.Contains(t, out, "example:")
	assert.Contains(t, out, "--slo-ttft")
}

// TestTuneOutEditsOnlyTunedValues: --out changes the lines of the values
// it tunes and no other byte (comments, blank lines, key order, quoting,
// flow style stay), and says which values the operator had set that it
// changes.
func TestTuneOutEditsOnlyTunedValues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base, tuned := filepath.Join(dir, "sluice.yaml"), filepath.Join(dir, "tuned.yaml")
	orig := `# lab node
listen: 127.0.0.1:8080

upstream:
  replicas:
    - {name: a, url: "http://127.0.0.1:8100", max_num_seqs: 32}

server:
  max_wait: 60s   # global ceiling

tenants:
  # the interactive product
  - name: solo
    weight: 2
    concurrency: 8  # agreed with the product team
    api_keys: ["` + config.HashKey("sk-solo") + `"]
    queue: {order: edf, max_wait: "10s"}
  - name: other
    api_keys:
      - "` + config.HashKey("sk-other") + `"
`
	require.NoError(t, os.WriteFile(base, []byte(orig), 0o600))
	code, out, errOut := runCLI(t, "", append([]string{"tune", "--limit", "--config", base, "--out", tuned}, sweepFixture(t)...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "# "+tuned+" changes values "+base+" sets:\n#   tenant solo: queue.max_wait 10s -> 1.9s\n#   tenant solo: concurrency 8 -> 32\n")
	got, err := os.ReadFile(tuned)
	require.NoError(t, err)
	want := strings.Replace(orig, "concurrency: 8  #", "concurrency: 32  #", 1)
	want = strings.Replace(want, `queue: {order: edf, max_wait: "10s"}`, `queue: {order: edf, max_wait: "1.9s", max_depth: 22}`, 1)
	assert.Equal(t, want, string(got), "only the tuned values change")

	// Without --out it says what --out would change.
	code, out, errOut = runCLI(t, "", append([]string{"tune", "--limit", "--config", base}, sweepFixture(t)...)...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "# --out would change values "+base+" sets:\n#   tenant solo: queue.max_wait 10s -> 1.9s\n")
}

// TestApplyTuneInsertsInPlace: missing keys are added beside the tenant's
// name (block style) or at the end of a flow mapping; values already right
// are not reported as changes.
func TestApplyTuneInsertsInPlace(t *testing.T) {
	t.Parallel()
	in := "tenants:\n" +
		"  - name: a   # first\n    weight: 1\n\n" +
		"  - name: b\n    queue:\n      order: fifo\n      max_depth: 22\n" +
		"  - {name: c, weight: 3}\n"
	recs := []tuneRec{
		{name: "a", maxWait: 1900 * time.Millisecond, maxDepth: 22, concurrency: 4},
		{name: "b", maxWait: 1900 * time.Millisecond, maxDepth: 22},
		{name: "c", maxWait: 2 * time.Second, maxDepth: 5, concurrency: 2},
	}
	out, changes, err := applyTune([]byte(in), recs)
	require.NoError(t, err)
	assert.Equal(t, "tenants:\n"+
		"  - name: a   # first\n    queue: {max_wait: 1.9s, max_depth: 22}\n    concurrency: 4\n    weight: 1\n\n"+
		"  - name: b\n    queue:\n      order: fifo\n      max_wait: 1.9s\n      max_depth: 22\n"+
		"  - {name: c, weight: 3, queue: {max_wait: 2s, max_depth: 5}, concurrency: 2}\n", string(out))
	assert.Empty(t, changes, "nothing the file set was changed")
}

// TestTuneNoKnee: when every run served what it was offered, none
// saturated: tune names no knee and says its values are a lower bound.
func TestTuneNoKnee(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var paths []string
	for i, r := range []struct{ sent, good, p50 float64 }{{5, 5, 40}, {10, 9.9, 45}, {20, 19.8, 60}} {
		doc := map[string]any{"good": r.good * 10, "median_ttft_ms": r.p50, "window": map[string]any{"start_s": 0, "end_s": 10},
			"schedule": map[string]any{"sent_rate": r.sent},
			"tenants":  map[string]any{"solo": map[string]any{"good": r.good * 10, "offered_rate": r.sent, "concurrency": 2.0, "max_concurrent_requests": 4.0}}}
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		p := filepath.Join(dir, fmt.Sprintf("r%d.json", i))
		require.NoError(t, os.WriteFile(p, b, 0o600))
		paths = append(paths, p)
	}
	code, out, errOut := runCLI(t, "", append([]string{"tune"}, paths...)...)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "# knee:")
	assert.NotContains(t, out, "at the knee")
	assert.Contains(t, out, "# no knee: no run saturated (each served at least 95% of its offered rate within the SLO), so capacity is above 19.80 req/s")
	assert.Contains(t, out, "19.80 req/s served in time at the best run")
}
