package scheduler

import (
	"context"
	"encoding/csv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/ledger"
)

// GET /admin/usage: this process's cumulative usage per tenant, key, model
// and dimension (the values behind sluice_usage_total), optionally over
// the last window only (whole hours, up to 31 days), as JSON or CSV. A
// fleet's usage is the sum over its instances, as with the counters.

// UsageReport is the answer of GET /admin/usage.
type UsageReport struct {
	// Since is when this process started counting (its start); with a
	// window, the start of the first hour counted.
	Since  time.Time       `json:"since"`
	Until  time.Time       `json:"until"`
	Window string          `json:"window,omitempty"`
	Rows   []UsageTotalRow `json:"rows"`
}

// UsageTotalRow is one tenant, key and model's usage; Usage maps each
// dimension (requests, input_tokens, cached_input_tokens, output_tokens,
// gpu_ms, gpu_joules in millijoules, usd_micros) to its amount.
type UsageTotalRow struct {
	Tenant string           `json:"tenant"`
	Key    string           `json:"key"`
	Model  string           `json:"model"`
	Usage  map[string]int64 `json:"usage"`
}

// usageDimNames are the dimension names of a usageCounters' slots.
func usageDimNames() [numUsage]string {
	var out [numUsage]string
	for i, d := range usageDims {
		out[i] = d.String()
	}
	out[len(usageDims)] = usageCachedInput
	return out
}

// UsageFilter selects rows of [Server.Usage]; empty fields match all.
type UsageFilter struct {
	Tenant, Key, Model, Dimension string
	// Window > 0 counts only the hours that overlap the last Window
	// (rounded up to whole hours); 0 counts since the process started.
	Window time.Duration
}

// Usage reports this process's usage under f.
func (s *Server) Usage(f UsageFilter) UsageReport {
	now := s.now()
	names := usageDimNames()
	r := UsageReport{Since: s.started.UTC(), Until: now.UTC(), Rows: []UsageTotalRow{}}
	var fromHour int64
	if f.Window > 0 {
		hours := int64((f.Window + time.Hour - 1) / time.Hour)
		fromHour = now.Unix()/3600 - hours + 1
		r.Window = f.Window.String()
		r.Since = time.Unix(fromHour*3600, 0).UTC()
	}
	s.usage.Range(func(k, v any) bool {
		uk, uc := k.(usageKey), v.(*usageCounters)
		if (f.Tenant != "" && uk.tenant != f.Tenant) || (f.Key != "" && uk.key != f.Key) || (f.Model != "" && uk.model != f.Model) {
			return true
		}
		var vals [numUsage]int64
		uc.mu.Lock()
		if f.Window > 0 {
			for _, b := range uc.hours {
				if b.hour >= fromHour && b.hour > 0 {
					for i, x := range b.v {
						vals[i] += x
					}
				}
			}
		} else {
			vals = uc.total
		}
		uc.mu.Unlock()
		row := UsageTotalRow{Tenant: uk.tenant, Key: uk.key, Model: uk.model, Usage: map[string]int64{}}
		for i, n := range names {
			if f.Dimension == "" || f.Dimension == n {
				row.Usage[n] = vals[i]
			}
		}
		r.Rows = append(r.Rows, row)
		return true
	})
	slices.SortFunc(r.Rows, func(a, b UsageTotalRow) int {
		return strings.Compare(a.Tenant+"\x00"+a.Key+"\x00"+a.Model, b.Tenant+"\x00"+b.Key+"\x00"+b.Model)
	})
	return r
}

func (a *Admin) usage(rc *fasthttp.RequestCtx) {
	q := rc.QueryArgs()
	f := UsageFilter{Tenant: string(q.Peek("tenant")), Key: string(q.Peek("key")), Model: string(q.Peek("model")),
		Dimension: string(q.Peek("dimension"))}
	if f.Tenant != "" && a.s.pol.Load().Tenants[f.Tenant] == nil {
		a.inputError(rc, inputErr("tenant", "unknown tenant %q", f.Tenant))
		return
	}
	if names := usageDimNames(); f.Dimension != "" && !slices.Contains(names[:], f.Dimension) {
		a.inputError(rc, inputErr("dimension", "must be one of %s (got %q)", strings.Join(names[:], ", "), f.Dimension))
		return
	}
	if w := string(q.Peek("window")); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 || d > usageHours*time.Hour {
			a.inputError(rc, inputErr("window", "must be a duration in (0, 744h] such as 24h or 720h (got %q)", w))
			return
		}
		f.Window = d
	}
	format := string(q.Peek("format"))
	if format == "" && strings.Contains(string(rc.Request.Header.Peek("Accept")), "text/csv") {
		format = "csv"
	}
	r := a.s.Usage(f)
	switch format {
	case "", "json":
		WriteJSON(rc, r)
	case "csv":
		rc.SetContentType("text/csv; charset=utf-8")
		w := csv.NewWriter(rc)
		names := usageDimNames()
		_ = w.Write(append([]string{"since", "until", "tenant", "key", "model"}, names[:]...))
		for _, row := range r.Rows {
			rec := []string{r.Since.Format(time.RFC3339), r.Until.Format(time.RFC3339), row.Tenant, row.Key, row.Model}
			for _, n := range names {
				v, ok := row.Usage[n]
				if !ok {
					rec = append(rec, "")
					continue
				}
				rec = append(rec, strconv.FormatInt(v, 10))
			}
			_ = w.Write(rec)
		}
		w.Flush()
	default:
		a.inputError(rc, inputErr("format", "must be json or csv (got %q)", format))
	}
}

// budgetUsage fills each budget row's use in its current window from the
// ledger (one snapshot per tenant). A tenant whose snapshot fails keeps
// its rows without use and names the error.
func (a *Admin) budgetUsage(ctx context.Context, rows []BudgetRow) {
	pol := a.s.pol.Load()
	snaps := map[string]*ledger.Usage{}
	errs := map[string]string{}
	for i := range rows {
		r := &rows[i]
		u, ok := snaps[r.Tenant]
		if !ok {
			var key ledger.ScopeKey
			if r.Tenant == GlobalTenant {
				key = a.s.keyer.GlobalKey()
			} else if t := pol.Tenants[r.Tenant]; t != nil {
				key = t.ScopeKey
			} else {
				continue
			}
			got, err := a.s.led.Snapshot(ctx, key, key)
			if err != nil {
				errs[r.Tenant] = oneLine(err)
			} else {
				u = &got
			}
			snaps[r.Tenant] = u
		}
		if u == nil {
			r.UsageError = errs[r.Tenant]
			continue
		}
		w, err := time.ParseDuration(r.Window)
		if err != nil {
			continue
		}
		lim := r.Limit
		var committed, reserved int64
		for _, ul := range u.Limits {
			if ul.Limit.Dim.String() == r.Dimension && ul.Limit.Window == w {
				committed, reserved = ul.Committed, ul.Reserved
				if !ul.ResetsAt.IsZero() {
					r.ResetsAt = ul.ResetsAt.UTC().Format(time.RFC3339)
				}
			}
		}
		r.Committed, r.Reserved = &committed, &reserved
		rem := max(lim-committed-reserved, 0)
		r.Remaining = &rem
	}
}
