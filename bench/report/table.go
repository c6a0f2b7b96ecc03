package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/bench/loadgen"
)

func f(d Doc, path ...string) float64 {
	v, _ := d.F(path...)
	return v
}

func line(w io.Writer, label string, v any) {
	switch x := v.(type) {
	case float64:
		fmt.Fprintf(w, "%-40s %-10.2f\n", label, x)
	default:
		fmt.Fprintf(w, "%-40s %-10v\n", label, x)
	}
}

func header(w io.Writer, s string, c byte) {
	n := 50 - len(s)
	left := n / 2
	fmt.Fprintf(w, "%s%s%s\n", strings.Repeat(string(c), left), s, strings.Repeat(string(c), n-left))
}

// Percentiles returns the pNN words present for metric (e.g. "ttft"),
// sorted numerically.
func Percentiles(d Doc, metric string) []string {
	var ps []string
	for k := range d {
		if strings.HasPrefix(k, "p") && strings.HasSuffix(k, "_"+metric+"_ms") {
			ps = append(ps, strings.TrimSuffix(strings.TrimPrefix(k, "p"), "_"+metric+"_ms"))
		}
	}
	sort.Slice(ps, func(i, j int) bool {
		a, _ := strconv.ParseFloat(ps[i], 64)
		b, _ := strconv.ParseFloat(ps[j], 64)
		return a < b
	})
	return ps
}

// WriteText prints vLLM's "Serving Benchmark Result" block (labels
// unchanged), Sluice's additions, the per-tenant table and the footers.
func WriteText(w io.Writer, d Doc, metrics []string) {
	header(w, " Serving Benchmark Result ", '=')
	line(w, "Successful requests:", int(f(d, "completed")))
	line(w, "Failed requests:", int(f(d, "failed")))
	if mc, ok := d.F("max_concurrency"); ok {
		line(w, "Maximum request concurrency:", int(mc))
	}
	line(w, "Benchmark duration (s):", f(d, "duration"))
	line(w, "Total input tokens:", int(f(d, "total_input_tokens")))
	line(w, "Total generated tokens:", int(f(d, "total_output_tokens")))
	line(w, "Request throughput (req/s):", f(d, "request_throughput"))
	line(w, "Request goodput (req/s):", f(d, "request_goodput"))
	line(w, "Output token throughput (tok/s):", f(d, "output_throughput"))
	line(w, "Peak output token throughput (tok/s):", f(d, "max_output_tokens_per_s"))
	line(w, "Peak concurrent requests:", int(f(d, "max_concurrent_requests")))
	line(w, "Total Token throughput (tok/s):", f(d, "total_token_throughput"))
	titles := map[string][2]string{
		"ttft": {"Time to First Token", "TTFT"},
		"tpot": {"Time per Output Token (excl. 1st token)", "TPOT"},
		"itl":  {"Inter-token Latency", "ITL"},
		"e2el": {"End-to-end Latency", "E2EL"},
	}
	for _, m := range metrics {
		t, ok := titles[m]
		if !ok {
			continue
		}
		header(w, t[0], '-')
		line(w, "Mean "+t[1]+" (ms):", f(d, "mean_"+m+"_ms"))
		line(w, "Median "+t[1]+" (ms):", f(d, "median_"+m+"_ms"))
		for _, p := range Percentiles(d, m) {
			line(w, "P"+p+" "+t[1]+" (ms):", f(d, "p"+p+"_"+m+"_ms"))
		}
	}
	header(w, "Sluice additions", '-')
	line(w, "Average concurrency (Little's law):", f(d, "concurrency"))
	line(w, "SLO attainment (good/sent):", fmt.Sprintf("%.1f%%", 100*f(d, "slo_attainment")))
	line(w, "Failures:", failures(d))
	header(w, "", '=')
	fmt.Fprintln(w)
	WriteTenantTable(w, d)
}

func failures(d Doc) string {
	o := d.M("outcomes")
	var parts []string
	for _, name := range loadgen.Outcomes {
		if name.OK() {
			continue
		}
		if rs, ok := o[string(name)].(map[string]any); ok {
			for _, r := range sortedKeys(rs) {
				n, _ := rs[r].(float64)
				if n > 0 {
					parts = append(parts, fmt.Sprintf("%s/%s:%d", name, r, int(n)))
				}
			}
		}
	}
	if late := f(d, "late"); late > 0 {
		parts = append(parts, fmt.Sprintf("late:%d", int(late)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func count(d Doc, outcome string) int {
	rs, _ := d.M("outcomes")[outcome].(map[string]any)
	n := 0
	for _, v := range rs {
		x, _ := v.(float64)
		n += int(x)
	}
	return n
}

func reasons(d Doc, outcome string) string {
	rs, _ := d.M("outcomes")[outcome].(map[string]any)
	var parts []string
	for _, k := range sortedKeys(rs) {
		x, _ := rs[k].(float64)
		if x > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", k, int(x)))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

// WriteTenantTable prints the per-tenant table and the fairness and load
// generator footers.
func WriteTenantTable(w io.Writer, d Doc) {
	fmt.Fprintf(w, "%-12s %4s %8s %6s %6s %-22s %5s %5s %8s %7s %13s %13s %9s %5s\n",
		"tenant", "w", "offered", "sent", "ok", "rej(reason:n)", "exp", "late", "goodput", "attain", "TTFT p50/p99", "TPOT p50/p99", "E2EL p99", "x_i")
	ts := d.M("tenants")
	for _, name := range d.TenantNames() {
		t, _ := ts[name].(map[string]any)
		td := Doc(t)
		label := name
		if r, _ := td["role"].(string); r == "aggressor" {
			label += "*"
		}
		fmt.Fprintf(w, "%-12s %4g %8.2f %6d %6d %-22s %5d %5d %8.2f %6.1f%% %13s %13s %9.0f %5.2f\n",
			label, f(td, "weight"), f(td, "offered_rate"), int(f(td, "sent")), int(f(td, "completed")), reasons(td, "rejected"),
			count(td, "expired"), int(f(td, "late")), f(td, "request_goodput"), 100*f(td, "slo_attainment"),
			fmt.Sprintf("%.0f/%.0f", f(td, "median_ttft_ms"), f(td, "p99_ttft_ms")),
			fmt.Sprintf("%.0f/%.0f", f(td, "median_tpot_ms"), f(td, "p99_tpot_ms")), f(td, "p99_e2el_ms"), f(td, "x"))
	}
	fmt.Fprintf(w, "Fairness: jain_share %.3f | jain_slo %.2f | max service diff %s/%gs", f(d, "fairness", "jain_share"),
		f(d, "fairness", "jain_slo_attainment"), human(f(d, "fairness", "max_service_diff")), f(d, "fairness", "service_window_s"))
	if r, ok := d.F("isolation", "p99_ttft_ratio"); ok {
		fmt.Fprintf(w, " | isolation p99 TTFT ×%.2f", r)
	}
	fmt.Fprintln(w)
	status := "OK"
	warn, _ := d.M("schedule")["warnings"].([]any)
	for _, x := range warn {
		if s, _ := x.(string); strings.HasPrefix(s, "generator lags") {
			status = "LAGGING"
		}
	}
	fmt.Fprintf(w, "Load generator: offered %.2f rps, sent %.2f rps, send lag p50 %.1f ms p99 %.1f ms [%s], new conns %d\n",
		f(d, "schedule", "offered_rate"), f(d, "schedule", "sent_rate"), f(d, "schedule", "send_lag_p50_ms"),
		f(d, "schedule", "send_lag_p99_ms"), status, int(f(d, "schedule", "new_connections")))
	for _, x := range warn {
		fmt.Fprintf(w, "WARNING: %v\n", x)
	}
}

func human(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

var csvCols = []string{"run", "tenant", "role", "weight", "offered_rate", "sent", "completed", "failed", "late", "rejected", "expired",
	"client_timeout", "error", "cancelled_at_end", "request_throughput", "request_goodput", "slo_attainment", "output_throughput",
	"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
	"median_e2el_ms", "p99_e2el_ms", "x", "served_share", "fair_share"}

func csvRow(run, tenant string, d Doc) []string {
	row := make([]string, 0, len(csvCols))
	for _, c := range csvCols {
		switch c {
		case "run":
			row = append(row, run)
		case "tenant":
			row = append(row, tenant)
		case "role":
			r, _ := d["role"].(string)
			row = append(row, r)
		case "rejected", "expired", "client_timeout", "error", "cancelled_at_end":
			row = append(row, strconv.Itoa(count(d, c)))
		default:
			if v, ok := d.F(c); ok {
				row = append(row, strconv.FormatFloat(v, 'g', 10, 64))
			} else {
				row = append(row, "")
			}
		}
	}
	return row
}

// WriteCSV writes a row per (run, tenant) plus _all and _victims; header
// included when header is set. reasons gets (run, tenant, outcome, reason,
// count) rows.
func WriteCSV(w, reasonsW io.Writer, run string, d Doc, header bool) error {
	cw := csv.NewWriter(w)
	rw := csv.NewWriter(reasonsW)
	if header {
		_ = cw.Write(csvCols)
		_ = rw.Write([]string{"run", "tenant", "outcome", "reason", "count"})
	}
	rows := []struct {
		name string
		d    Doc
	}{{"_all", d}}
	if v := d.M("victims"); v != nil {
		rows = append(rows, struct {
			name string
			d    Doc
		}{"_victims", v})
	}
	ts := d.M("tenants")
	for _, n := range d.TenantNames() {
		t, _ := ts[n].(map[string]any)
		rows = append(rows, struct {
			name string
			d    Doc
		}{n, t})
	}
	for _, r := range rows {
		_ = cw.Write(csvRow(run, r.name, r.d))
		o := r.d.M("outcomes")
		for _, oc := range sortedKeys(o) {
			rs, _ := o[oc].(map[string]any)
			for _, rk := range sortedKeys(rs) {
				n, _ := rs[rk].(float64)
				_ = rw.Write([]string{run, r.name, oc, rk, strconv.Itoa(int(n))})
			}
		}
	}
	cw.Flush()
	rw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("csv: %w", err)
	}
	if err := rw.Error(); err != nil {
		return fmt.Errorf("csv reasons: %w", err)
	}
	return nil
}

// MarkdownHeader is the header of [MarkdownRow] tables.
const MarkdownHeader = "| run | req/s | goodput | attain | TTFT p50/p99 ms | TPOT p50/p99 ms | E2EL p50/p99 ms | rejected | expired | victims p99 TTFT ms | jain_share |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|"

// MarkdownRow renders one result as a BENCHMARKS.md table row.
func MarkdownRow(label string, d Doc) string {
	vp := "-"
	if v, ok := d.F("victims", "p99_ttft_ms"); ok {
		vp = fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("| %s | %.2f | %.2f | %.1f%% | %.0f/%.0f | %.1f/%.1f | %.0f/%.0f | %s | %s | %s | %.3f |",
		label, f(d, "request_throughput"), f(d, "request_goodput"), 100*f(d, "slo_attainment"),
		f(d, "median_ttft_ms"), f(d, "p99_ttft_ms"), f(d, "median_tpot_ms"), f(d, "p99_tpot_ms"),
		f(d, "median_e2el_ms"), f(d, "p99_e2el_ms"), reasons(d, "rejected"), reasons(d, "expired"), vp, f(d, "fairness", "jain_share"))
}
