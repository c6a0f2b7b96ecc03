package deploy

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// promtool returns promtool's path; scripts/ensure-deps.sh (make deps)
// installs it from Debian's prometheus package.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is missing: run `make deps` (scripts/ensure-deps.sh)")
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	c := exec.Command(promtool(t), args...)
	c.Dir = dir
	out, err := c.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
}

// ruleFile is the rules file format (and a PrometheusRule's spec).
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func alertRules(t *testing.T) ruleFile {
	t.Helper()
	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(readFile(t, deployPath(t, "prometheus", "sluice-alerts.yaml")), &rf))
	return rf
}

// dashboard is the part of Grafana's dashboard JSON the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int     `json:"id"`
	Type        string  `json:"type"`
	Title       string  `json:"title"`
	Description string  `json:"description"`
	Panels      []panel `json:"panels"`
	Targets     []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	require.NoError(t, json.Unmarshal(readFile(t, deployPath(t, "grafana", "sluice-dashboard.json")), &d))
	return d
}

// flatPanels lists every panel, rows' children included.
func (d dashboard) flatPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// exprs returns each panel query by panel title.
func (d dashboard) exprs() map[string][]string {
	out := map[string][]string{}
	for _, p := range d.flatPanels() {
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	return out
}

var metricName = regexp.MustCompile(`\bsluice_[a-z0-9_]+\b`)

// names returns the sluice_* metric names in exprs, sorted and unique.
func names(exprs ...string) []string {
	set := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			set[n] = true
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (d dashboard) metricNames() []string {
	var all []string
	for _, es := range d.exprs() {
		all = append(all, es...)
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			s, _ := q["query"].(string)
			all = append(all, s)
		}
	}
	return names(all...)
}

// conditionalMarker in a panel's description says its series exist only
// under a condition the running-server test cannot create (NVML, a Redis
// ledger, a failure). The dashboard stays the one place names are kept.
const conditionalMarker = "Only exported when"

// conditionalNames are the names every panel using them marks conditional.
func (d dashboard) conditionalNames() map[string]bool {
	cond, plain := map[string]bool{}, map[string]bool{}
	for _, p := range d.flatPanels() {
		var exprs []string
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
		for _, n := range names(exprs...) {
			if strings.Contains(p.Description, conditionalMarker) {
				cond[n] = true
			} else {
				plain[n] = true
			}
		}
	}
	for n := range plain {
		delete(cond, n)
	}
	return cond
}

func (rf ruleFile) metricNames() []string {
	var all []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			all = append(all, r.Expr)
		}
	}
	return names(all...)
}

// family maps a series name to its metric family: histogram series end in
// _bucket, _sum or _count; families holds the exported families.
func family(name string, families map[string]string) (string, bool) {
	if _, ok := families[name]; ok {
		return name, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && families[base] == "histogram" {
			return base, true
		}
	}
	return "", false
}

func TestAlertRulesPromtool(t *testing.T) {
	dir := deployPath(t, "prometheus")
	t.Run("check rules", func(t *testing.T) { runPromtool(t, dir, "check", "rules", "sluice-alerts.yaml") })
	t.Run("rule unit tests", func(t *testing.T) { runPromtool(t, dir, "test", "rules", "sluice-alerts.test.yaml") })
	t.Run("every alert has a unit test and severity", func(t *testing.T) {
		tests := string(readFile(t, filepath.Join(dir, "sluice-alerts.test.yaml")))
		for _, g := range alertRules(t).Groups {
			for _, r := range g.Rules {
				require.NotEmpty(t, r.Alert, "group %s has a non-alert rule", g.Name)
				assert.Contains(t, tests, "alertname: "+r.Alert+"\n", "no promtool test for %s", r.Alert)
				assert.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], r.Alert)
				assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
			}
		}
	})
}

// TestDashboardPromQL runs every dashboard query through promtool's parser,
// as recording rules, with Grafana's variables replaced.
func TestDashboardPromQL(t *testing.T) {
	d := loadDashboard(t)
	repl := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
		"$namespace", ".*", "$instance", ".*", "$tenant", ".*", "$replica", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	titles := make([]string, 0)
	for title := range d.exprs() {
		titles = append(titles, title)
	}
	sort.Strings(titles)
	for _, title := range titles {
		for _, e := range d.exprs()[title] {
			require.NotContains(t, repl.Replace(e), "$", "panel %q uses an unknown variable: %s", title, e)
			n++
			fmt.Fprintf(&b, "      - record: dashboard:panel_%d\n        expr: %q\n", n, repl.Replace(e))
		}
	}
	require.Positive(t, n)
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	require.NoError(t, os.WriteFile(f, []byte(b.String()), 0o600))
	runPromtool(t, filepath.Dir(f), "check", "rules", filepath.Base(f))
}

func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	assert.Equal(t, "sluice-overview", d.UID)
	ids := map[int]string{}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	for _, p := range d.flatPanels() {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, other, p.Title)
		}
		ids[p.ID] = p.Title
		if p.Type != "row" {
			assert.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		}
	}
	assert.Equal(t, []string{"datasource", "namespace", "instance", "tenant", "replica"}, vars)
	// The required panels, by the metric each must show.
	for _, want := range []struct{ what, metric string }{
		{"queue depth", "sluice_queue_depth"}, {"queue wait", "sluice_queue_wait_seconds_bucket"},
		{"admissions", "sluice_requests_total"}, {"rejections by reason", "sluice_rejections_total"},
		{"ledger reserved", "sluice_ledger_reserved"}, {"ledger committed", "sluice_ledger_committed"},
		{"ledger unresolved", "sluice_ledger_unresolved"}, {"GPU-ms per tenant", "sluice_tenant_gpu_ms_total"},
		{"replica capacity", "sluice_replica_capacity_tokens"}, {"in-flight tokens", "sluice_replica_inflight_tokens"},
		{"upstream aborts", "sluice_upstream_aborts_total"}, {"TTFT", "sluice_ttft_seconds_bucket"},
		{"upstream latency", "sluice_upstream_latency_seconds_bucket"},
	} {
		assert.Contains(t, d.metricNames(), want.metric, "dashboard lacks %s", want.what)
	}
}

func TestConditionalNames(t *testing.T) {
	d := dashboard{Panels: []panel{
		{Title: "a", Description: "x. " + conditionalMarker + " NVML is available.", Targets: []struct {
			Expr string `json:"expr"`
		}{{Expr: "sluice_nvml + sluice_both"}}},
		{Title: "b", Description: "plain", Targets: []struct {
			Expr string `json:"expr"`
		}{{Expr: "sluice_both"}}},
	}}
	assert.Equal(t, map[string]bool{"sluice_nvml": true}, d.conditionalNames())
}

func TestAlertMetricsOnDashboard(t *testing.T) {
	dash := d2set(loadDashboard(t).metricNames())
	for _, n := range alertRules(t).metricNames() {
		assert.True(t, dash[n], "alert rules use %s, which the dashboard does not show", n)
	}
}

func d2set(ns []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range ns {
		m[n] = true
	}
	return m
}

var update = flag.Bool("update", false, "rewrite deploy/kubernetes/monitoring/prometheusrule.yaml from deploy/prometheus/sluice-alerts.yaml")

const promRuleHeader = "# Generated from deploy/prometheus/sluice-alerts.yaml (its groups, verbatim) by\n" +
	"#   go test ./test/deploy -run TestPrometheusRuleMatchesRulesFile -update\n" +
	"# test/deploy fails when the two differ.\n"

// TestPrometheusRuleMatchesRulesFile keeps the Prometheus Operator's copy of
// the rules equal to the promtool-checked file; -update regenerates it.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	target := deployPath(t, "kubernetes", "monitoring", "prometheusrule.yaml")
	if *update {
		var spec yaml.Node
		require.NoError(t, yaml.Unmarshal(readFile(t, deployPath(t, "prometheus", "sluice-alerts.yaml")), &spec))
		pr := map[string]any{
			"apiVersion": "monitoring.coreos.com/v1",
			"kind":       "PrometheusRule",
			"metadata":   map[string]any{"name": "sluice", "labels": map[string]string{"app.kubernetes.io/name": "sluice"}},
			"spec":       spec.Content[0],
		}
		var b strings.Builder
		b.WriteString(promRuleHeader)
		enc := yaml.NewEncoder(&b)
		enc.SetIndent(2)
		require.NoError(t, enc.Encode(pr))
		require.NoError(t, os.WriteFile(target, []byte(b.String()), 0o644))
	}
	docs := decodeDocs(t, target)
	require.Len(t, docs, 1)
	var pr struct {
		Kind string   `yaml:"kind"`
		Spec ruleFile `yaml:"spec"`
	}
	require.NoError(t, docs[0].node.Decode(&pr))
	assert.Equal(t, "PrometheusRule", pr.Kind)
	assert.Equal(t, alertRules(t), pr.Spec, "run: go test ./test/deploy -run TestPrometheusRuleMatchesRulesFile -update")
}

// parseExposition returns the metric families of a Prometheus text
// exposition by name, with their type.
func parseExposition(text string) map[string]string {
	fams := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) == 2 {
				fams[f[0]] = f[1]
			}
		}
	}
	return fams
}

// compareNames returns the dashboard/rule names the server lacks (but for
// those marked conditional) and the sluice_* families the dashboard lacks.
func compareNames(used []string, conditional map[string]bool, fams map[string]string) (missing, unshown []string) {
	shown := map[string]bool{}
	for _, n := range used {
		f, ok := family(n, fams)
		if !ok {
			if !conditional[n] {
				missing = append(missing, n)
			}
			continue
		}
		shown[f] = true
	}
	for f := range fams {
		if strings.HasPrefix(f, "sluice_") && !shown[f] {
			unshown = append(unshown, f)
		}
	}
	sort.Strings(unshown)
	return missing, unshown
}

func TestCompareNames(t *testing.T) {
	t.Parallel()
	fams := map[string]string{"sluice_a_total": "counter", "sluice_wait_seconds": "histogram", "sluice_extra": "gauge", "go_goroutines": "gauge"}
	tests := []struct {
		name             string
		used             []string
		conditional      map[string]bool
		missing, unshown []string
	}{
		{name: "all shown", used: []string{"sluice_a_total", "sluice_wait_seconds_bucket", "sluice_extra"}},
		{name: "histogram series", used: []string{"sluice_a_total", "sluice_wait_seconds_sum", "sluice_wait_seconds_count", "sluice_extra"}},
		{name: "unknown name", used: []string{"sluice_a_total", "sluice_wait_seconds_bucket", "sluice_extra", "sluice_gone"}, missing: []string{"sluice_gone"}},
		{name: "_bucket of a counter is unknown", used: []string{"sluice_a_total_bucket", "sluice_wait_seconds", "sluice_extra"},
			missing: []string{"sluice_a_total_bucket"}, unshown: []string{"sluice_a_total"}},
		{name: "unshown family", used: []string{"sluice_a_total"}, unshown: []string{"sluice_extra", "sluice_wait_seconds"}},
		{name: "conditional name may be absent", used: []string{"sluice_a_total", "sluice_wait_seconds_bucket", "sluice_extra", "sluice_nvml_only"},
			conditional: map[string]bool{"sluice_nvml_only": true}},
		{name: "conditional does not hide a present family", used: []string{"sluice_a_total", "sluice_wait_seconds_bucket"},
			conditional: map[string]bool{"sluice_extra": true}, unshown: []string{"sluice_extra"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			missing, unshown := compareNames(tc.used, tc.conditional, fams)
			assert.Equal(t, tc.missing, missing)
			assert.Equal(t, tc.unshown, unshown)
		})
	}
	assert.True(t, slices.Equal([]string{"sluice_a", "sluice_b_bucket"}, names(`rate(sluice_b_bucket[5m]) / sluice_a`, "sluice_a")))
}
