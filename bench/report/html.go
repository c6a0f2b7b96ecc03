package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"strings"

	"github.com/sluicehq/sluice/bench/loadgen"
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func color(i int) string { return palette[i%len(palette)] }

// outcomeColors give each outcome a hue; reasons within it get shades.
var outcomeColors = map[string][]string{
	"success":          {"#2ca02c"},
	"late":             {"#bcbd22"},
	"rejected":         {"#d62728", "#ff7f7f", "#a00000", "#ff4040"},
	"expired":          {"#9467bd", "#c5b0d5"},
	"client_timeout":   {"#17becf", "#9edae5"},
	"error":            {"#7f7f7f", "#444444", "#b0b0b0", "#000000"},
	"cancelled_at_end": {"#8c564b"},
}

func outcomeColor(outcome string, n int) string {
	if cs, ok := outcomeColors[outcome]; ok {
		return cs[n%len(cs)]
	}
	return color(n)
}

const (
	svgW, svgH          = 760, 260
	padL, padR, padT    = 60, 150, 20
	padB                = 40
	plotW, plotH        = svgW - padL - padR, svgH - padT - padB
	outcomeBarH, barGap = 18, 6
)

type svgBuf struct{ strings.Builder }

func (b *svgBuf) open(title string, h int) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img"><title>%s</title>`,
		svgW, h, svgW, h, html.EscapeString(title))
	fmt.Fprintf(b, `<rect x="0" y="0" width="%d" height="%d" fill="#fff"/>`, svgW, h)
}

func (b *svgBuf) axes(xmax, ymax float64, xlabel, ylabel string) {
	fmt.Fprintf(b, `<g stroke="#999" stroke-width="1"><line x1="%d" y1="%d" x2="%d" y2="%d"/><line x1="%d" y1="%d" x2="%d" y2="%d"/></g>`,
		padL, padT+plotH, padL+plotW, padT+plotH, padL, padT, padL, padT+plotH)
	for i := 0; i <= 4; i++ {
		y := padT + plotH - plotH*i/4
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="10" text-anchor="end">%s</text>`, padL-4, y+3, tick(ymax*float64(i)/4))
		x := padL + plotW*i/4
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="10" text-anchor="middle">%s</text>`, x, padT+plotH+14, tick(xmax*float64(i)/4))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>`, padL+plotW/2, padT+plotH+32, html.EscapeString(xlabel))
	fmt.Fprintf(b, `<text x="12" y="%d" font-size="11" transform="rotate(-90 12 %d)" text-anchor="middle">%s</text>`,
		padT+plotH/2, padT+plotH/2, html.EscapeString(ylabel))
}

func (b *svgBuf) legend(i int, name string, dashed bool) {
	b.legendColor(i, name, color(i), dashed)
}

func (b *svgBuf) legendColor(i int, name, col string, dashed bool) {
	y := padT + 14*i
	dash := ""
	if dashed {
		dash = ` stroke-dasharray="4 3"`
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d" font-size="11">%s</text>`,
		padL+plotW+10, y, padL+plotW+28, y, col, dash, padL+plotW+32, y+4, html.EscapeString(name))
}

func tick(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 10 || v == 0:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

type tseries struct {
	name         string
	p50, p99, sv []float64
	rej          []float64
}

func floats(v any) []float64 {
	xs, _ := v.([]any)
	out := make([]float64, len(xs))
	for i, x := range xs {
		if f, ok := x.(float64); ok {
			out[i] = f
		} else {
			out[i] = math.NaN()
		}
	}
	return out
}

func readSeries(d Doc) (float64, []tseries) {
	s := d.M("series")
	bin, _ := s["bin_s"].(float64)
	ts, _ := s["tenants"].([]any)
	var out []tseries
	for _, t := range ts {
		m, _ := t.(map[string]any)
		name, _ := m["name"].(string)
		out = append(out, tseries{name: name, p50: floats(m["ttft_p50_ms"]), p99: floats(m["ttft_p99_ms"]),
			sv: floats(m["served_cost"]), rej: floats(m["rejects"])})
	}
	return bin, out
}

// TTFTChart draws per-tenant p50 (dashed) and p99 TTFT per bin, with
// rejections as ticks under the axis.
func TTFTChart(d Doc) string {
	bin, ts := readSeries(d)
	var b svgBuf
	b.open("Per-tenant TTFT over time", svgH)
	nb, ymax := 0, 1.0
	for _, t := range ts {
		nb = max(nb, len(t.p99))
		for _, v := range t.p99 {
			if !math.IsNaN(v) {
				ymax = max(ymax, v)
			}
		}
	}
	xmax := float64(max(nb, 1)) * bin
	b.axes(xmax, ymax, "time (s)", "TTFT (ms), p99 solid, p50 dashed")
	x := func(i int) float64 { return padL + float64(plotW)*(float64(i)+0.5)*bin/xmax }
	y := func(v float64) float64 { return padT + float64(plotH)*(1-v/ymax) }
	for i, t := range ts {
		for k, vals := range [][]float64{t.p99, t.p50} {
			var pts []string
			for j, v := range vals {
				if !math.IsNaN(v) {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(j), y(v)))
				}
			}
			dash := ""
			if k == 1 {
				dash = ` stroke-dasharray="4 3"`
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>`, color(i), dash, strings.Join(pts, " "))
		}
		for j, r := range t.rej {
			if r > 0 {
				fmt.Fprintf(&b, `<line class="reject" x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"><title>%s: %g rejected</title></line>`,
					x(j), padT+plotH+2+2*i, x(j), padT+plotH+6+2*i, color(i), html.EscapeString(t.name), r)
			}
		}
		b.legend(i, t.name, false)
	}
	b.WriteString("</svg>")
	return b.String()
}

// ShareChart draws each tenant's share of served cost per bin as a stacked
// area.
func ShareChart(d Doc) string {
	bin, ts := readSeries(d)
	var b svgBuf
	b.open("Throughput share over time", svgH)
	nb := 0
	for _, t := range ts {
		nb = max(nb, len(t.sv))
	}
	xmax := float64(max(nb, 1)) * bin
	b.axes(xmax, 1, "time (s)", "share of served cost")
	x := func(i int) float64 { return padL + float64(plotW)*(float64(i)+0.5)*bin/xmax }
	y := func(v float64) float64 { return padT + float64(plotH)*(1-v) }
	total := make([]float64, nb)
	for _, t := range ts {
		for j, v := range t.sv {
			if !math.IsNaN(v) {
				total[j] += v
			}
		}
	}
	base := make([]float64, nb)
	for i, t := range ts {
		top := make([]float64, nb)
		for j := range nb {
			v := 0.0
			if j < len(t.sv) && !math.IsNaN(t.sv[j]) && total[j] > 0 {
				v = t.sv[j] / total[j]
			}
			top[j] = base[j] + v
		}
		var pts []string
		for j := range nb {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(j), y(top[j])))
		}
		for j := nb - 1; j >= 0; j-- {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(j), y(base[j])))
		}
		fmt.Fprintf(&b, `<polygon fill="%s" fill-opacity="0.7" stroke="none" points="%s"/>`, color(i), strings.Join(pts, " "))
		base = top
		b.legend(i, t.name, false)
	}
	b.WriteString("</svg>")
	return b.String()
}

// OutcomeChart draws one stacked bar per tenant, split by outcome/reason.
func OutcomeChart(d Doc) string {
	names := d.TenantNames()
	h := padT + padB + len(names)*(outcomeBarH+barGap) + 40
	var b svgBuf
	b.open("Outcomes per tenant", h)
	ts := d.M("tenants")
	keys := map[string]string{} // key → colour
	var order []string
	perOutcome := map[string]int{}
	maxN := 1.0
	type seg struct {
		key string
		n   float64
	}
	bars := make([][]seg, len(names))
	for i, n := range names {
		t := Doc(asMap(ts[n]))
		o := t.M("outcomes")
		sum := 0.0
		for _, oc := range outcomeOrder(o) {
			rs := asMap(o[oc])
			for _, r := range sortedKeys(rs) {
				c, _ := rs[r].(float64)
				if c == 0 {
					continue
				}
				k := oc
				if r != "-" {
					k += "/" + r
				}
				if _, ok := keys[k]; !ok {
					keys[k] = outcomeColor(oc, perOutcome[oc])
					perOutcome[oc]++
					order = append(order, k)
				}
				bars[i] = append(bars[i], seg{k, c})
				sum += c
			}
		}
		maxN = max(maxN, sum)
	}
	for i, n := range names {
		y := padT + i*(outcomeBarH+barGap)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" text-anchor="end">%s</text>`, padL-4, y+13, html.EscapeString(n))
		x := float64(padL)
		for _, s := range bars[i] {
			w := float64(plotW) * s.n / maxN
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %g</title></rect>`,
				x, y, w, outcomeBarH, keys[s.key], html.EscapeString(n), html.EscapeString(s.key), s.n)
			x += w
		}
	}
	for i, k := range order {
		b.legendColor(i, k, keys[k], false)
	}
	b.WriteString("</svg>")
	return b.String()
}

// outcomeOrder lists the outcomes present in report order (success first).
func outcomeOrder(o Doc) []string {
	var out []string
	for _, name := range loadgen.Outcomes {
		if _, ok := o[string(name)]; ok {
			out = append(out, string(name))
		}
	}
	return out
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// LineChart plots y against x for sweep results (one series per name).
func LineChart(title, xlabel, ylabel string, xs []float64, ys map[string][]float64, names []string) string {
	var b svgBuf
	b.open(title, svgH)
	xmax, ymax := 1.0, 1.0
	for _, x := range xs {
		xmax = max(xmax, x)
	}
	for _, v := range ys {
		for _, y := range v {
			if !math.IsNaN(y) {
				ymax = max(ymax, y)
			}
		}
	}
	b.axes(xmax, ymax, xlabel, ylabel)
	for i, n := range names {
		var pts []string
		for j, y := range ys[n] {
			if j < len(xs) && !math.IsNaN(y) {
				px := padL + float64(plotW)*xs[j]/xmax
				py := padT + float64(plotH)*(1-y/ymax)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, px, py, color(i))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, color(i), strings.Join(pts, " "))
		b.legend(i, n, false)
	}
	b.WriteString("</svg>")
	return b.String()
}

// Section is one block of an HTML page.
type Section struct {
	Heading string
	Text    string   // preformatted
	SVGs    []string // inline SVG documents (trusted: drawn here)
}

// Page is a self-contained HTML report.
type Page struct {
	Title    string
	Sections []Section
	Results  []Doc // embedded as JSON
}

var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
pre{font:12px/1.35 ui-monospace,Menlo,Consolas,monospace;background:#f7f7f7;padding:10px;overflow-x:auto}
.charts{display:flex;flex-wrap:wrap;gap:12px}details{margin-top:24px}
</style></head><body>
<h1>{{.Title}}</h1>
{{range .Sections}}<section><h2>{{.Heading}}</h2>{{if .Text}}<pre>{{.Text}}</pre>{{end}}
<div class="charts">{{range .SVGs}}{{.}}{{end}}</div></section>
{{end}}<details><summary>Result JSON</summary><pre id="result-json">{{.JSON}}</pre></details>
</body></html>
`))

// WriteHTML renders the page. It references no external scripts,
// stylesheets or fonts, so it opens offline.
func WriteHTML(w io.Writer, p Page) error {
	js, err := json.MarshalIndent(p.Results, "", " ")
	if err != nil {
		return fmt.Errorf("html: %w", err)
	}
	type sec struct {
		Heading, Text string
		SVGs          []template.HTML
	}
	data := struct {
		Title    string
		Sections []sec
		JSON     string
	}{Title: p.Title, JSON: string(js)}
	for _, s := range p.Sections {
		x := sec{Heading: s.Heading, Text: s.Text}
		for _, svg := range s.SVGs {
			x.SVGs = append(x.SVGs, template.HTML(svg)) //nolint:gosec // drawn by this package, user strings escaped
		}
		data.Sections = append(data.Sections, x)
	}
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, data); err != nil {
		return fmt.Errorf("html: %w", err)
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// RunSection is the standard section for one result: text table and the
// three charts.
func RunSection(heading string, d Doc, metrics []string) Section {
	var t bytes.Buffer
	WriteText(&t, d, metrics)
	return Section{Heading: heading, Text: t.String(), SVGs: []string{TTFTChart(d), ShareChart(d), OutcomeChart(d)}}
}
