package adminapi

import (
	"encoding/csv"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/views"
)

// GET /admin/usage: this process's cumulative usage per tenant, key, model
// and dimension (the values behind sluice_usage_total), optionally over
// the last window only (whole hours, up to 31 days), as JSON or CSV. A
// fleet's usage is the sum over its instances, as with the counters.
func (a *Admin) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := views.UsageFilter{Tenant: q.Get("tenant"), Key: q.Get("key"), Model: q.Get("model"), Dimension: q.Get("dimension")}
	if f.Tenant != "" && !a.s.HasTenant(f.Tenant) {
		inputError(w, inputErr("tenant", "unknown tenant %q", f.Tenant))
		return
	}
	names := lifecycle.UsageDimensions()
	if f.Dimension != "" && !slices.Contains(names, f.Dimension) {
		inputError(w, inputErr("dimension", "must be one of %s (got %q)", strings.Join(names, ", "), f.Dimension))
		return
	}
	var window time.Duration
	if win := q.Get("window"); win != "" {
		d, err := time.ParseDuration(win)
		if err != nil || d <= 0 || d > lifecycle.UsageWindowMax {
			inputError(w, inputErr("window", "must be a duration in (0, 744h] such as 24h or 720h (got %q)", win))
			return
		}
		window = d
	}
	format := q.Get("format")
	if format == "" && strings.Contains(r.Header.Get("Accept"), "text/csv") {
		format = "csv"
	}
	switch format {
	case "", "json":
		writeJSON(w, views.Usage(a.s.UsageCounts(window), f))
	case "csv":
		rep := views.Usage(a.s.UsageCounts(window), f)
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		cw := csv.NewWriter(w)
		_ = cw.Write(append([]string{"since", "until", "tenant", "key", "model"}, names...))
		for _, row := range rep.Rows {
			rec := []string{rep.Since.Format(time.RFC3339), rep.Until.Format(time.RFC3339), row.Tenant, row.Key, row.Model}
			for _, n := range names {
				v, ok := row.Usage[n]
				if !ok {
					rec = append(rec, "")
					continue
				}
				rec = append(rec, strconv.FormatInt(v, 10))
			}
			_ = cw.Write(rec)
		}
		cw.Flush()
	default:
		inputError(w, inputErr("format", "must be json or csv (got %q)", format))
	}
}
