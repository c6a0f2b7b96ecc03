package report

import (
	"github.com/sluicehq/sluice/internal/schematest"

	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/stats"
	"github.com/sluicehq/sluice/bench/workload"
)

const ms1 = time.Millisecond

func fixture(t *testing.T) (*workload.Schedule, *loadgen.Result, Doc) {
	t.Helper()
	ttft := 150.0
	plans := []workload.Plan{
		{Name: "chat-a", Weight: 1, Role: "victim", SLO: workload.SLO{TTFTMs: &ttft}, Cost: workload.Cost{Input: 1, Output: 2}, APIKey: "sk-secret-a"},
		{Name: "flood", Weight: 1, Role: "aggressor", Cost: workload.Cost{Input: 1, Output: 2}, APIKey: "sk-secret-f"},
	}
	ok := func(tenant, n int, at time.Duration) loadgen.Record {
		return loadgen.Record{ID: "x", Tenant: tenant, N: n, Intended: at, Sent: at, First: at + 100*ms1, FirstContent: at + 100*ms1,
			Done: at + 150*ms1, ITL: []time.Duration{25 * ms1, 25 * ms1}, InTokens: 10, InIntended: 10, OutTokens: 3, OutIntended: 3,
			Chunks: 3, Status: 200, Outcome: loadgen.Success}
	}
	rej := func(tenant, n int, at time.Duration) loadgen.Record {
		return loadgen.Record{ID: "y", Tenant: tenant, N: n, Intended: at, Sent: at, First: -1, FirstContent: -1, Done: at + ms1,
			InTokens: 10, InIntended: 10, OutIntended: 3, Status: 429, Outcome: loadgen.Rejected, Reason: "queue_full"}
	}
	run := &loadgen.Result{Records: []loadgen.Record{ok(0, 0, 0), ok(1, 0, 10*ms1), rej(1, 1, 20*ms1), ok(0, 1, 6*time.Second),
		rej(1, 2, 7*time.Second)}}
	sc := &workload.Schedule{Tenants: plans, Duration: 8 * time.Second}
	res := stats.Analyze(sc, run, stats.Options{Percentiles: []float64{50, 90, 99}})
	d, err := Build(res, Meta{Label: "B", Backend: "openai", Endpoint: "/v1/completions", ModelID: "m", RequestRate: "inf",
		Burstiness: 1, Date: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Metadata: map[string]string{"queue_depth": "8"},
		Config: map[string]any{"api_keys": []string{MaskKey("sk-secret-a")}}})
	require.NoError(t, err)
	return sc, run, d
}

func loadSchema(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../result.schema.json")
	require.NoError(t, err)
	return b
}

func TestResultValidatesAgainstSchema(t *testing.T) {
	t.Parallel()
	_, _, d := fixture(t)
	schema := loadSchema(t)
	require.NoError(t, schematest.ValidateSchema(schema, d))
	// vLLM keys present with vLLM's names.
	for _, k := range []string{"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
		"request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
		"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "p90_tpot_ms", "p50_itl_ms", "p99_e2el_ms"} {
		assert.Contains(t, d, k)
	}
	assert.NotContains(t, mustJSON(t, d), "sk-secret", "API keys never appear raw")
	assert.InDelta(t, 2.0, f(d, "tenants", "flood", "outcomes", "rejected", "queue_full"), 0)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestSchemaRejectsBadDocs(t *testing.T) {
	t.Parallel()
	schema := loadSchema(t)
	for _, tc := range []struct {
		name   string
		mutate func(Doc)
		want   string
	}{
		{"missing vLLM key", func(d Doc) { delete(d, "request_throughput") }, `missing required "request_throughput"`},
		{"wrong type", func(d Doc) { d["completed"] = "many" }, "$.completed: want integer"},
		{"unknown top-level key", func(d Doc) { d["surprise"] = 1 }, `unexpected property "surprise"`},
		{"bad outcome", func(d Doc) { d.M("outcomes")["vanished"] = map[string]any{} }, `unexpected property "vanished"`},
		{"tenant missing share", func(d Doc) { delete(d.M("tenants").M2("chat-a"), "x") }, `$.tenants.chat-a: missing required "x"`},
		{"jain out of range", func(d Doc) { d.M("fairness")["jain_share"] = 1.5 }, "1.5 > maximum 1"},
		{"wrong schema id", func(d Doc) { d["schema"] = "v0" }, "$.schema: want sluice.bench.result/v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, d := fixture(t)
			tc.mutate(d)
			err := schematest.ValidateSchema(schema, d)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// M2 reads a sub-object of a sub-object, for tests.
func (d Doc) M2(key string) map[string]any { return asMap(d[key]) }

func TestTextTable(t *testing.T) {
	t.Parallel()
	_, _, d := fixture(t)
	var b bytes.Buffer
	WriteText(&b, d, []string{"ttft", "tpot", "itl", "e2el"})
	out := b.String()
	for _, want := range []string{
		"============ Serving Benchmark Result ============",
		"Successful requests:                     3         ",
		"Failed requests:                         2         ",
		"---------------Time to First Token----------------",
		"-----Time per Output Token (excl. 1st token)------",
		"Mean TTFT (ms):                          100.00",
		"P99 TTFT (ms):                           100.00",
		"Mean TPOT (ms):                          25.00",
		"Failures:                                rejected/queue_full:2",
		"flood*",
		"queue_full:2",
		"Fairness: jain_share",
		"Load generator: offered",
	} {
		assert.Contains(t, out, want)
	}
}

func TestHTMLIsSelfContained(t *testing.T) {
	t.Parallel()
	_, _, d := fixture(t)
	var b bytes.Buffer
	require.NoError(t, WriteHTML(&b, Page{Title: "run <1>", Sections: []Section{RunSection("B", d, []string{"ttft"})}, Results: []Doc{d}}))
	page := b.String()
	assert.Equal(t, 3, strings.Count(page, "<svg "), "one SVG per chart")
	for _, title := range []string{"Per-tenant TTFT over time", "Throughput share over time", "Outcomes per tenant"} {
		assert.Contains(t, page, "<title>"+title+"</title>")
	}
	assert.Contains(t, page, "run &lt;1&gt;", "title escaped")
	// Nothing fetched from the network: no scripts, links, images, imports or remote URLs outside the SVG namespace.
	for _, bad := range []string{"<script", "<link", "<img", "@import", "<iframe"} {
		assert.NotContains(t, page, bad)
	}
	urls := regexp.MustCompile(`(?:src|href)\s*=|url\(|https?://`).FindAllString(page, -1)
	assert.Equal(t, []string{"http://", "http://", "http://"}, urls, "only the three SVG xmlns attributes")
	assert.Equal(t, 3, strings.Count(page, `xmlns="http://www.w3.org/2000/svg"`))
	assert.Contains(t, page, `class="reject"`, "rejections drawn as ticks")
	assert.Contains(t, page, "&#34;schema&#34;: &#34;sluice.bench.result/v1&#34;", "result JSON embedded")
}

func TestCSVAndJSONL(t *testing.T) {
	t.Parallel()
	sc, run, d := fixture(t)
	var rows, reasonsB bytes.Buffer
	require.NoError(t, WriteCSV(&rows, &reasonsB, "r1", d, true))
	recs, err := csv.NewReader(&rows).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 5, "header, _all, _victims, chat-a, flood")
	assert.Equal(t, []string{"_all", "_victims", "chat-a", "flood"}, []string{recs[1][1], recs[2][1], recs[3][1], recs[4][1]})
	assert.Equal(t, "2", recs[4][9], "flood rejected")
	assert.Contains(t, reasonsB.String(), "r1,flood,rejected,queue_full,2\n")

	var jl bytes.Buffer
	require.NoError(t, WriteJSONL(&jl, sc, run.Records, false))
	lines := strings.Split(strings.TrimSpace(jl.String()), "\n")
	require.Len(t, lines, 5)
	var first RecordLine
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	assert.Equal(t, "chat-a", first.Tenant)
	assert.InDelta(t, 100.0, *first.TTFT, 1e-9)
	assert.InDelta(t, 150.0, *first.E2EL, 1e-9)
	assert.InDelta(t, 25.0, *first.TPOT, 1e-9)
	var rej RecordLine
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &rej))
	assert.Equal(t, "rejected", rej.Outcome)
	assert.Equal(t, "queue_full", rej.Reason)
	assert.Nil(t, rej.TTFT)
}

func TestRatios(t *testing.T) {
	t.Parallel()
	mk := func(rps, p50 float64) Doc {
		return Doc{"request_throughput": rps, "median_ttft_ms": p50, "victims": map[string]any{"p99_ttft_ms": p50 * 2}}
	}
	pairs := [][2]Doc{{mk(10, 100), mk(12, 110)}, {mk(10, 100), mk(9, 104)}, {mk(8, 100), mk(10, 120)}}
	rs := Ratios(pairs)
	got := map[string]Ratio{}
	for _, r := range rs {
		got[r.Metric] = r
	}
	require.Len(t, rs, 3)
	assert.InDelta(t, 1.2, got["request_throughput"].Median, 1e-9)
	assert.InDelta(t, 0.9, got["request_throughput"].Min, 1e-9)
	assert.InDelta(t, 1.25, got["request_throughput"].Max, 1e-9)
	assert.True(t, got["p50_ttft_ms"].Delta)
	assert.InDelta(t, 10.0, got["p50_ttft_ms"].Median, 1e-9)
	assert.Equal(t, "lower", got["victims_p99_ttft"].Better)
	assert.InDelta(t, 1.1, got["victims_p99_ttft"].Median, 1e-9)
	var b bytes.Buffer
	WriteRatios(&b, []Doc{pairs[0][0]}, []Doc{pairs[0][1]})
	assert.Contains(t, b.String(), "request_throughput   higher          1.200")
}

func TestMarkdownRow(t *testing.T) {
	t.Parallel()
	_, _, d := fixture(t)
	row := MarkdownRow("flood B", d)
	header, _, found := strings.Cut(MarkdownHeader, "\n")
	require.True(t, found, "MarkdownHeader has a separator line")
	assert.Equal(t, strings.Count(header, "|"), strings.Count(row, "|"))
	assert.Contains(t, row, "| flood B |")
	assert.Contains(t, row, "queue_full:2")
}

func TestMaskKey(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "sk-…ey", MaskKey("sk-very-long-key"))
	assert.Equal(t, "***", MaskKey("short"))
	assert.Empty(t, MaskKey(""))
}
