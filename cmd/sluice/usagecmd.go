package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"
)

// usageDims are GET /admin/usage's dimensions in the order the table
// prints them (scheduler/adminapi/usage.go).
var usageDims = []string{"requests", "input_tokens", "cached_input_tokens", "output_tokens", "gpu_ms", "gpu_joules", "usd_micros"}

// runUsage prints GET /admin/usage: a running server's cumulative usage
// per tenant, key and model (since it started, or over --window), as a
// table, --json or --csv (the chargeback export).
func runUsage(ctx context.Context, e env, args []string) error {
	fs := newFlags("usage")
	o := addAdminFlags(fs)
	tenant := fs.String("tenant", "", "only this tenant")
	key := fs.String("key", "", "only this key name (_unnamed: the tenant's unnamed keys)")
	model := fs.String("model", "", "only this model")
	dim := fs.String("dimension", "", "only this dimension ("+joinBar(usageDims)+")")
	window := fs.String("window", "", "only the last DUR (whole hours, up to 744h); default: since the server started")
	asCSV := fs.Bool("csv", false, "print CSV (one row per tenant, key and model)")
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	if *asCSV && o.asJSON {
		return usagef("--csv and --json are exclusive")
	}
	if *dim != "" {
		if err := oneOf("dimension", *dim, usageDims); err != nil {
			return err
		}
	}
	q := url.Values{}
	for k, v := range map[string]string{"tenant": *tenant, "key": *key, "model": *model, "dimension": *dim} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *window != "" {
		d, err := positiveDuration("window", *window)
		if err != nil {
			return err
		}
		if d > 744*time.Hour {
			return usagef("--window must be at most 744h (31 days), got %s", *window)
		}
		q.Set("window", *window)
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	if *asCSV {
		q.Set("format", "csv")
		data, err := c.do(ctx, http.MethodGet, "/admin/usage", q, nil)
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(data)
		return err
	}
	return c.call(ctx, e, o, http.MethodGet, "/admin/usage", q, nil, func(w io.Writer, data []byte) error {
		var r struct {
			Since, Until time.Time
			Window       string
			Rows         []struct {
				Tenant, Key, Model string
				Usage              map[string]int64
			}
		}
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		span := "since the server started, " + r.Since.Format(time.RFC3339)
		if r.Window != "" {
			span = "over the last " + r.Window + ", from " + r.Since.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "usage %s (this instance; sum a fleet's instances)\n", span)
		if len(r.Rows) == 0 {
			_, err := fmt.Fprintln(w, "no usage")
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "TENANT\tKEY\tMODEL")
		for _, d := range usageDims {
			if *dim == "" || d == *dim {
				fmt.Fprintf(tw, "\t%s", usageHeader(d))
			}
		}
		fmt.Fprintln(tw)
		for _, row := range r.Rows {
			fmt.Fprintf(tw, "%s\t%s\t%s", row.Tenant, row.Key, row.Model)
			for _, d := range usageDims {
				if *dim == "" || d == *dim {
					fmt.Fprintf(tw, "\t%d", row.Usage[d])
				}
			}
			fmt.Fprintln(tw)
		}
		return tw.Flush()
	})
}

func usageHeader(d string) string {
	switch d {
	case "gpu_joules":
		return "GPU_MJ" // millijoules
	case "usd_micros":
		return "USD_MICROS"
	}
	return map[string]string{"requests": "REQUESTS", "input_tokens": "INPUT", "cached_input_tokens": "CACHED",
		"output_tokens": "OUTPUT", "gpu_ms": "GPU_MS"}[d]
}

func joinBar(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += "|"
		}
		out += x
	}
	return out
}
