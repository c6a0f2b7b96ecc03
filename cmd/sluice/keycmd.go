package main

// `sluice key create|list|revoke` wrap the run-time key endpoints of the
// admin API (POST/GET/DELETE /admin/keys); `sluice key hash` (configcmd.go)
// stays the offline helper for keys written into the config file.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

// keyBudget is a budget as the keys API takes and lists it.
type keyBudget struct {
	Dimension string `json:"dimension"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window"`
	Mode      string `json:"mode,omitempty"`
}

// keyRow is one key of GET /admin/keys (no secret).
type keyRow struct {
	ID          string      `json:"id"`
	Tenant      string      `json:"tenant"`
	Name        string      `json:"name"`
	Label       string      `json:"label"`
	HashPrefix  string      `json:"hash_prefix"`
	Source      string      `json:"source"`
	ExpiresAt   *time.Time  `json:"expires_at"`
	Expired     bool        `json:"expired"`
	Budgets     []keyBudget `json:"budgets"`
	Concurrency int         `json:"concurrency"`
	Orphaned    bool        `json:"orphaned"`
}

// budgetFlags collects repeated --budget DIMENSION:LIMIT/WINDOW[:warn].
type budgetFlags []keyBudget

func (b *budgetFlags) String() string { return "" }

func (b *budgetFlags) Set(v string) error {
	dim, rest, ok := strings.Cut(v, ":")
	lim, win, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 {
		return fmt.Errorf("want DIMENSION:LIMIT/WINDOW, e.g. tokens:100000/24h (got %q)", v)
	}
	mode := "block"
	if w, m, ok := strings.Cut(win, ":"); ok {
		win, mode = w, m
	}
	if err := oneOf("budget dimension", dim, budgetDimensions); err != nil {
		return err
	}
	var n int64
	if _, err := fmt.Sscan(lim, &n); err != nil || n < 0 {
		return fmt.Errorf("limit must be an integer >= 0 (got %q)", lim)
	}
	if _, err := positiveDuration("budget window", win); err != nil {
		return err
	}
	if mode != "block" && mode != "warn" {
		return fmt.Errorf("mode must be block or warn (got %q)", mode)
	}
	*b = append(*b, keyBudget{Dimension: dim, Limit: n, Window: win, Mode: mode})
	return nil
}

func runKeyCreate(ctx context.Context, e env, args []string) error {
	fs := newFlags("key create")
	o := addAdminFlags(fs)
	tenant := fs.String("tenant", "", "tenant the key belongs to (required)")
	name := fs.String("name", "", "key name, shown in metrics and errors (optional)")
	expires := fs.String("expires-in", "", "lifetime, a duration like 720h (optional; default never)")
	conc := fs.Int("concurrency", 0, "the key's own cap on requests in flight (0: only the tenant's)")
	var budgets budgetFlags
	fs.Var(&budgets, "budget", "the key's own budget DIMENSION:LIMIT/WINDOW[:warn], repeatable")
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	if *tenant == "" {
		return usagef("--tenant is required")
	}
	if *expires != "" {
		if _, err := positiveDuration("expires-in", *expires); err != nil {
			return err
		}
	}
	if *conc < 0 {
		return usagef("--concurrency must be >= 0, got %d", *conc)
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	body := map[string]any{"tenant": *tenant, "name": *name, "expires_in": *expires, "concurrency": *conc, "budgets": []keyBudget(budgets)}
	return c.call(ctx, e, o, http.MethodPost, "/admin/keys", nil, body, func(w io.Writer, data []byte) error {
		var k struct {
			keyRow
			Key string `json:"key"`
		}
		if err := decodeInto(data, &k); err != nil {
			return err
		}
		if err := writeKeys(w, []keyRow{k.keyRow}); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "\nkey: %s\nThis is the only time the key is shown; store it now.\n", k.Key)
		return err
	})
}

func runKeyList(ctx context.Context, e env, args []string) error {
	return runTenantList(ctx, e, args, "key list", "keys", "/admin/keys", writeKeys)
}

func runKeyRevoke(ctx context.Context, e env, args []string) error {
	fs := newFlags("key revoke")
	o := addAdminFlags(fs)
	pos, err := parseInterleaved(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("usage: sluice key revoke ID (the id from 'sluice key list')")
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	return c.call(ctx, e, o, http.MethodDelete, "/admin/keys/"+url.PathEscape(pos[0]), nil, nil, func(w io.Writer, data []byte) error {
		var out struct {
			Revoked keyRow `json:"revoked"`
		}
		if err := decodeInto(data, &out); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "revoked %s (%s, tenant %s)\n", out.Revoked.ID, out.Revoked.Label, out.Revoked.Tenant)
		return err
	})
}

func writeKeys(w io.Writer, rows []keyRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tKEY\tHASH\tSOURCE\tEXPIRES\tCONCURRENCY\tBUDGETS")
	for _, k := range rows {
		id := k.ID
		if id == "" {
			id = "-"
		}
		exp := "never"
		if k.ExpiresAt != nil {
			exp = k.ExpiresAt.UTC().Format(time.RFC3339)
			if k.Expired {
				exp += " (expired)"
			}
		}
		var bs []string
		for _, b := range k.Budgets {
			bs = append(bs, fmt.Sprintf("%s:%d/%s", b.Dimension, b.Limit, b.Window))
		}
		budgets := strings.Join(bs, ",")
		if budgets == "" {
			budgets = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", id, k.Tenant, k.Label, k.HashPrefix, k.Source, exp, k.Concurrency, budgets)
	}
	return tw.Flush()
}
