// Package report renders analysed bench results: the stdout table, the
// JSON result (a superset of `vllm bench serve`'s keys, schema
// sluice.bench.result/v1), CSV, per-request JSONL, markdown rows, A/B
// ratios and a self-contained HTML page with inline SVG charts.
//
// Results travel as [Doc] (the decoded JSON object), so `compare` works on
// saved files exactly as `ab` works on fresh runs.
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/bench/stats"
	"github.com/sluicehq/sluice/bench/workload"
)

// Schema names the JSON result format.
const Schema = "sluice.bench.result/v1"

// Doc is a result document: the JSON object as written to --save-result.
type Doc map[string]any

// Meta is the run's description, written next to the metrics.
type Meta struct {
	Label          string // "A", "B", or a run label
	Backend        string
	Endpoint       string
	BaseURL        string
	ModelID        string
	NumPrompts     int
	RequestRate    string
	Burstiness     float64
	MaxConcurrency int
	Date           time.Time
	Metadata       map[string]string
	Config         map[string]any // API keys already masked
	Isolation      map[string]any // nil when no baseline
}

// MaskKey hides an API key for output: the first 3 and last 2 characters.
func MaskKey(k string) string {
	switch {
	case k == "":
		return ""
	case len(k) <= 8:
		return "***"
	}
	return k[:3] + "…" + k[len(k)-2:]
}

func num(f float64) any {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil
	}
	return f
}

func distFields(m Doc, name string, d stats.Dist) {
	m["mean_"+name+"_ms"] = num(d.Mean)
	m["median_"+name+"_ms"] = num(d.Median)
	m["std_"+name+"_ms"] = num(d.Std)
	for k, v := range d.P {
		m["p"+k+"_"+name+"_ms"] = num(v)
	}
}

// SummaryFields renders a summary under vLLM's key names plus additions.
func SummaryFields(s *stats.Summary) Doc {
	m := Doc{
		"duration":                s.Duration,
		"completed":               s.Completed,
		"failed":                  s.Failed,
		"sent":                    s.Sent,
		"good":                    s.Good,
		"late":                    s.Late,
		"total_input_tokens":      s.TotalInputTokens,
		"total_output_tokens":     s.TotalOutputTokens,
		"total_chunks":            s.TotalChunks,
		"request_throughput":      s.RequestThroughput,
		"request_goodput":         s.RequestGoodput,
		"output_throughput":       s.OutputThroughput,
		"total_token_throughput":  s.TotalTokenThroughput,
		"max_output_tokens_per_s": s.MaxOutputTokensPerS,
		"max_concurrent_requests": s.MaxConcurrentRequests,
		"concurrency":             s.Concurrency,
		"slo_attainment":          s.SLOAttainment,
		"token_goodput":           s.TokenGoodput,
		"outcomes":                outcomes(s.Outcomes),
	}
	distFields(m, "ttft", s.TTFT)
	distFields(m, "tpot", s.TPOT)
	distFields(m, "itl", s.ITL)
	distFields(m, "e2el", s.E2EL)
	return m
}

func outcomes(o map[string]map[string]int) map[string]any {
	out := map[string]any{}
	for _, name := range loadgen.Outcomes {
		reasons := map[string]any{}
		for r, n := range o[string(name)] {
			if r == "" {
				r = "-"
			}
			reasons[r] = n
		}
		out[string(name)] = reasons
	}
	return out
}

func series(s stats.Series) Doc {
	ts := []any{}
	for _, t := range s.Tenants {
		conv := func(xs []float64) []any {
			out := make([]any, len(xs))
			for i, x := range xs {
				out[i] = num(x)
			}
			return out
		}
		ts = append(ts, Doc{"name": t.Name, "ttft_p50_ms": conv(t.TTFTP50), "ttft_p99_ms": conv(t.TTFTP99),
			"rejects": t.Rejects, "served_cost": conv(t.Served)})
	}
	return Doc{"bin_s": s.BinS, "tenants": ts}
}

// Build assembles the result document. The map is round-tripped through
// encoding/json so that a fresh Doc and one read from disk look the same.
func Build(res *stats.Result, meta Meta) (Doc, error) {
	m := SummaryFields(&res.Summary)
	m["schema"] = Schema
	m["date"] = meta.Date.UTC().Format("20060102-150405")
	m["label"] = meta.Label
	m["backend"] = meta.Backend
	m["endpoint"] = meta.Endpoint
	m["base_url"] = meta.BaseURL
	m["model_id"] = meta.ModelID
	m["tokenizer_id"] = meta.ModelID
	m["num_prompts"] = res.Summary.Requests
	m["request_rate"] = meta.RequestRate
	m["burstiness"] = num(meta.Burstiness)
	if meta.MaxConcurrency > 0 {
		m["max_concurrency"] = meta.MaxConcurrency
	} else {
		m["max_concurrency"] = nil
	}
	m["itl_method"] = "hdr3"
	m["window"] = Doc{"start_s": res.WindowStart, "end_s": res.WindowEnd}
	m["windowed"] = SummaryFields(&res.Windowed)
	fa := Doc{}
	distFields(fa, "ttft", res.FromArrival.TTFT)
	distFields(fa, "e2el", res.FromArrival.E2EL)
	m["from_arrival"] = fa
	warn := res.Schedule.Warnings
	if warn == nil {
		warn = []string{}
	}
	m["schedule"] = Doc{
		"offered_rate":     res.Schedule.OfferedRate,
		"sent_rate":        res.Schedule.SentRate,
		"send_lag_p50_ms":  res.Schedule.SendLag.P["50"],
		"send_lag_p99_ms":  res.Schedule.SendLag.P["99"],
		"send_lag_max_ms":  res.Schedule.SendLag.P["100"],
		"new_connections":  res.Schedule.NewConns,
		"warnings":         warn,
		"percentiles_used": res.Percentiles,
	}
	m["fairness"] = Doc{
		"jain_share":          res.Fairness.JainShare,
		"jain_slo_attainment": res.Fairness.JainSLOAttainment,
		"max_service_diff":    res.Fairness.MaxServiceDiff,
		"mean_service_diff":   res.Fairness.MeanServiceDiff,
		"service_window_s":    res.Fairness.WindowS,
		"capacity_cost":       res.Fairness.Capacity,
		"lambda":              num(res.Fairness.Lambda),
	}
	if meta.Isolation != nil {
		m["isolation"] = meta.Isolation
	} else {
		m["isolation"] = nil
	}
	tenants := Doc{}
	for _, t := range res.Tenants {
		tm := SummaryFields(&t.Summary)
		tm["role"] = t.Role
		tm["weight"] = t.Weight
		tm["offered_rate"] = t.Offered
		tm["deadline_s"] = t.Deadline
		tm["send_lag_p99_ms"] = t.SendLag.P["99"]
		tm["demand_cost"] = t.Share.Demand
		tm["served_cost"] = t.Share.Served
		tm["alloc_cost"] = t.Share.Alloc
		tm["x"] = t.Share.X
		tm["backlogged"] = t.Share.Backlogged
		tm["served_share"] = t.Share.ServedShare
		tm["fair_share"] = t.Share.FairShare
		tenants[t.Name] = tm
	}
	m["tenants"] = tenants
	if res.Victims != nil {
		m["victims"] = SummaryFields(res.Victims)
	} else {
		m["victims"] = nil
	}
	m["series"] = series(res.Series)
	if meta.Config == nil {
		meta.Config = map[string]any{}
	}
	m["config"] = meta.Config
	md := map[string]any{}
	for k, v := range meta.Metadata {
		md[k] = v
	}
	m["metadata"] = md
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("result json: %w", err)
	}
	var d Doc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("result json: %w", err)
	}
	return d, nil
}

// Load reads a saved result.
func Load(path string) (Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load result: %w", err)
	}
	var d Doc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("load result %s: %w", path, err)
	}
	return d, nil
}

// F reads a number at a dotted path ("tenants.chat-a.p99_ttft_ms"); ok is
// false when missing or null.
func (d Doc) F(path ...string) (float64, bool) {
	var cur any = map[string]any(d)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			if dm, ok2 := cur.(Doc); ok2 {
				m = dm
			} else {
				return 0, false
			}
		}
		cur = m[p]
	}
	f, ok := cur.(float64)
	return f, ok
}

// M reads a sub-object.
func (d Doc) M(key string) Doc {
	if m, ok := d[key].(map[string]any); ok {
		return m
	}
	return nil
}

// TenantNames returns the result's tenants, sorted.
func (d Doc) TenantNames() []string {
	var names []string
	for k := range d.M("tenants") {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// RecordLine is one line of --save-requests JSONL.
type RecordLine struct {
	ID        string   `json:"id"`
	Tenant    string   `json:"tenant"`
	N         int      `json:"n"`
	TIntended float64  `json:"t_intended_ms"`
	TSent     *float64 `json:"t_sent_ms"`
	TFirst    *float64 `json:"t_first_ms"`
	TDone     *float64 `json:"t_done_ms"`
	TTFT      *float64 `json:"ttft_ms"`
	E2EL      *float64 `json:"e2el_ms"`
	TPOT      *float64 `json:"tpot_ms"`
	InTokens  int      `json:"in_tokens"`
	OutTokens int      `json:"out_tokens"`
	Chunks    int      `json:"chunks"`
	Status    int      `json:"status"`
	Outcome   string   `json:"outcome"`
	Reason    string   `json:"reason"`
	DeadlineS float64  `json:"deadline_s"`
	ClientQMs float64  `json:"client_queue_ms"`
	// THeaders is when the response's headers arrived; ServerQMs and
	// ServerUpMs are a Sluice target's Server-Timing (absent otherwise).
	THeaders   *float64  `json:"t_headers_ms"`
	ServerQMs  *float64  `json:"server_queue_ms,omitempty"`
	ServerUpMs *float64  `json:"server_upstream_ms,omitempty"`
	ITLMs      []float64 `json:"itl_ms,omitempty"`
}

func msp(d time.Duration) *float64 {
	if d < 0 {
		return nil
	}
	v := float64(d) / 1e6
	return &v
}

// WriteJSONL writes one line per request (everything else recomputes from
// these). With itl set it also keeps each request's exact ITL gaps.
func WriteJSONL(w interface{ Write([]byte) (int, error) }, sched *workload.Schedule, recs []loadgen.Record, itl bool) error {
	enc := json.NewEncoder(w)
	for i := range recs {
		r := &recs[i]
		l := RecordLine{ID: r.ID, Tenant: sched.Tenants[r.Tenant].Name, N: r.N, TIntended: float64(r.Intended) / 1e6,
			TSent: msp(r.Sent), TFirst: msp(r.First), TDone: msp(r.Done), InTokens: r.InTokens, OutTokens: r.OutTokens,
			Chunks: r.Chunks, Status: r.Status, Outcome: string(r.Outcome), Reason: r.Reason, DeadlineS: r.DeadlineS,
			ClientQMs: float64(r.ClientQueue) / 1e6, THeaders: msp(r.Headers), ServerQMs: msp(r.ServerQueue), ServerUpMs: msp(r.ServerUpstream)}
		if r.Sent >= 0 && r.First >= 0 {
			l.TTFT = msp(r.TTFT())
		}
		if r.Outcome.OK() {
			l.E2EL = msp(r.E2EL())
			if r.OutTokens > 1 {
				v := float64(r.E2EL()-r.TTFT()) / 1e6 / float64(r.OutTokens-1)
				l.TPOT = &v
			}
		}
		if itl {
			for _, g := range r.ITL {
				l.ITLMs = append(l.ITLMs, float64(g)/1e6)
			}
		}
		if err := enc.Encode(l); err != nil {
			return fmt.Errorf("requests jsonl: %w", err)
		}
	}
	return nil
}
