package main

// The admin clients: thin callers of a running server's admin API
// (scheduler/admin*.go). Each validates its flags locally (usage error,
// exit 2), makes one HTTP call with a 10 s timeout, and prints either an
// aligned table or, with --json, the server's JSON indented. The admin token
// comes only from $SLUICE_ADMIN_TOKEN: it is never a flag and never printed.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/scheduler/config"
)

const (
	defaultAdminURL = "http://127.0.0.1:8081"
	adminURLEnv     = "SLUICE_ADMIN_URL"
	adminTokenEnv   = "SLUICE_ADMIN_TOKEN"
)

// adminTimeout bounds each admin call (connect, request and response body).
// Tests shorten it.
var adminTimeout = 10 * time.Second

// budgetDimensions are the budget dimensions the config accepts
// (ARCHITECTURE §3.2), kept in one place: scheduler/config.
var budgetDimensions = config.Dimensions

var reservationStates = []string{"unresolved", "dispatched", "reserved"}

// adminOpts are the flags every admin client takes.
type adminOpts struct {
	url    string
	asJSON bool
}

func addAdminFlags(fs *flag.FlagSet) *adminOpts {
	o := &adminOpts{}
	def := defaultAdminURL
	if v := strings.TrimSpace(os.Getenv(adminURLEnv)); v != "" {
		def = v
	}
	fs.StringVar(&o.url, "admin", def, "admin API base URL (or $"+adminURLEnv+"); the token is read from $"+adminTokenEnv)
	fs.BoolVar(&o.asJSON, "json", false, "print the server's JSON instead of a table")
	return o
}

// adminClient calls one server's admin API.
type adminClient struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// client checks the base URL and the token and returns a client; both
// problems are usage errors.
func (o *adminOpts) client() (*adminClient, error) {
	u, err := url.Parse(strings.TrimRight(strings.TrimSpace(o.url), "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("--admin must be an http(s) URL like %s, got %q", defaultAdminURL, o.url)
	}
	tok := strings.TrimSpace(os.Getenv(adminTokenEnv))
	if tok == "" {
		return nil, usagef("%s is not set: export the server's admin token to use the admin API", adminTokenEnv)
	}
	return &adminClient{base: u, token: tok, hc: &http.Client{Timeout: adminTimeout}}, nil
}

// adminAPIError is an error reply of the admin API, in the pinned shape.
type adminAPIError struct {
	Status  int
	Code    string
	Message string
	Param   string
}

func (e *adminAPIError) Error() string {
	msg := oneLine(e.Message)
	if msg == "" {
		msg = fmt.Sprintf("HTTP %d %s", e.Status, e.Code)
	}
	if e.Param != "" {
		msg += " (param: " + e.Param + ")"
	}
	return msg
}

// do makes one call and returns the 200 body. body, when non-nil, is sent
// as JSON.
func (c *adminClient) do(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	// path is already escaped (url.PathEscape on each id segment).
	target := c.base.String() + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	where := c.base.Redacted()
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, callError(where, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, callError(where, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, replyError(resp.StatusCode, data)
	}
	return data, nil
}

// callError turns a transport failure into one line naming the admin URL.
func callError(where string, err error) error {
	var nerr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("cannot reach the admin API at %s: connection refused (is sluice serve running? set --admin or $%s)", where, adminURLEnv)
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout()):
		return fmt.Errorf("no answer from the admin API at %s within %s", where, adminTimeout)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("admin call to %s: %w", where, context.Canceled)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	return fmt.Errorf("cannot reach the admin API at %s: %v", where, err)
}

// replyError reads a non-200 reply: the pinned error shape when it is one,
// else the status and the start of the body.
func replyError(status int, data []byte) error {
	var eb struct {
		Error *struct {
			Message string  `json:"message"`
			Code    string  `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &eb) == nil && eb.Error != nil {
		e := &adminAPIError{Status: status, Code: eb.Error.Code, Message: eb.Error.Message}
		if eb.Error.Param != nil {
			e.Param = *eb.Error.Param
		}
		return e
	}
	snippet := oneLine(string(data))
	if r := []rune(snippet); len(r) > 200 {
		snippet = string(r[:200]) + "…"
	}
	if snippet == "" {
		return &adminAPIError{Status: status, Message: fmt.Sprintf("HTTP %d from the admin API", status)}
	}
	return &adminAPIError{Status: status, Message: fmt.Sprintf("HTTP %d from the admin API: %s", status, snippet)}
}

// call makes one call and prints the reply: the JSON indented with --json,
// else what human renders from it.
func (c *adminClient) call(ctx context.Context, e env, o *adminOpts, method, path string, query url.Values, body any, human func(io.Writer, []byte) error) error {
	data, err := c.do(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	if o.asJSON {
		var buf bytes.Buffer
		if err := json.Indent(&buf, bytes.TrimSpace(data), "", "  "); err != nil {
			return fmt.Errorf("admin API sent invalid JSON: %w", err)
		}
		buf.WriteByte('\n')
		_, err := e.stdout.Write(buf.Bytes())
		return err
	}
	return human(e.stdout, data)
}

// decodeInto decodes a reply for human output.
func decodeInto(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("admin API sent an unexpected reply: %w", err)
	}
	return nil
}

// parseInterleaved parses flags that may come before or after positional
// arguments (`budget rm ID --json`, `tenant clamp NAME --reason x`), which
// Go's flag package alone stops at. Everything after "--" is positional.
// It returns the positional arguments; more than maxPos (maxPos >= 0) is a usage
// error.
func parseInterleaved(fs *flag.FlagSet, args []string, maxPos int) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args, -1); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if maxPos >= 0 && len(pos) > maxPos {
		return nil, flagError{usageError{fmt.Errorf("unexpected argument %q", pos[maxPos])}, fs}
	}
	return pos, nil
}

// flagSet reports whether the named flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			found = true
		}
	})
	return found
}

// positiveDuration parses a flag value that must be a duration > 0.
func positiveDuration(flagName, v string) (time.Duration, error) {
	if strings.TrimSpace(v) == "" {
		return 0, usagef("--%s is required (a duration like 30m or 1h)", flagName)
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return 0, usagef("--%s must be a positive duration like 30m or 1h, got %q", flagName, v)
	}
	return d, nil
}

// oneOf checks v against the allowed values.
func oneOf(flagName, v string, allowed []string) error {
	if !slices.Contains(allowed, v) {
		return usagef("--%s must be one of %s, got %q", flagName, strings.Join(allowed, "|"), v)
	}
	return nil
}

// ---- budget ----

// budgetRow is one row of GET /admin/budgets.
type budgetRow struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Dimension string `json:"dimension"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window"`
	Mode      string `json:"mode"`
	Source    string `json:"source"`
	// The current window's use (GET /admin/budgets; absent from a set).
	Committed  *int64 `json:"committed"`
	Reserved   *int64 `json:"reserved"`
	Remaining  *int64 `json:"remaining"`
	UsageError string `json:"usage_error"`
}

func runBudgetSet(ctx context.Context, e env, args []string) error {
	fs := newFlags("budget set")
	o := addAdminFlags(fs)
	tenant := fs.String("tenant", "", "tenant name (required)")
	dim := fs.String("dimension", "", "dimension: "+strings.Join(budgetDimensions, "|")+" (required)")
	limit := fs.Int64("limit", 0, "limit per window, >= 0 (required)")
	window := fs.String("window", "", "window, a positive duration like 1h (required)")
	mode := fs.String("mode", "block", "block (deny over the limit) or warn")
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	if *tenant == "" {
		return usagef("--tenant is required")
	}
	if *dim == "" {
		return usagef("--dimension is required (%s)", strings.Join(budgetDimensions, "|"))
	}
	if err := oneOf("dimension", *dim, budgetDimensions); err != nil {
		return err
	}
	if !flagSet(fs, "limit") {
		return usagef("--limit is required")
	}
	if *limit < 0 {
		return usagef("--limit must be >= 0, got %d", *limit)
	}
	if _, err := positiveDuration("window", *window); err != nil {
		return err
	}
	if err := oneOf("mode", *mode, []string{"block", "warn"}); err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	body := struct {
		Tenant    string `json:"tenant"`
		Dimension string `json:"dimension"`
		Limit     int64  `json:"limit"`
		Window    string `json:"window"`
		Mode      string `json:"mode"`
	}{*tenant, *dim, *limit, strings.TrimSpace(*window), *mode}
	return c.call(ctx, e, o, http.MethodPut, "/admin/budgets", nil, body, func(w io.Writer, data []byte) error {
		var b budgetRow
		if err := decodeInto(data, &b); err != nil {
			return err
		}
		return writeBudgets(w, []budgetRow{b})
	})
}

func runBudgetList(ctx context.Context, e env, args []string) error {
	return runTenantList(ctx, e, args, "budget list", "budgets", "/admin/budgets", writeBudgets)
}

// runTenantList is a `… list [--tenant T]` command: GET path (filtered to
// one tenant when asked), printed by write, or "no <what>".
func runTenantList[T any](ctx context.Context, e env, args []string, cmd, what, path string, write func(io.Writer, []T) error) error {
	fs := newFlags(cmd)
	o := addAdminFlags(fs)
	tenant := fs.String("tenant", "", "only this tenant's "+what)
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	var q url.Values
	if *tenant != "" {
		q = url.Values{"tenant": {*tenant}}
	}
	return c.call(ctx, e, o, http.MethodGet, path, q, nil, func(w io.Writer, data []byte) error {
		var rows []T
		if err := decodeInto(data, &rows); err != nil {
			return err
		}
		if len(rows) == 0 {
			_, err := fmt.Fprintln(w, "no "+what)
			return err
		}
		return write(w, rows)
	})
}

func writeBudgets(w io.Writer, rows []budgetRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	withUse := slices.ContainsFunc(rows, func(b budgetRow) bool { return b.Committed != nil || b.UsageError != "" })
	if !withUse {
		fmt.Fprintln(tw, "ID\tTENANT\tDIMENSION\tLIMIT\tWINDOW\tMODE\tSOURCE")
	} else {
		fmt.Fprintln(tw, "ID\tTENANT\tDIMENSION\tLIMIT\tWINDOW\tMODE\tSOURCE\tUSED\tREMAINING")
	}
	for _, b := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s", b.ID, b.Tenant, b.Dimension, b.Limit, b.Window, b.Mode, b.Source)
		switch {
		case !withUse:
		case b.Committed != nil && b.Remaining != nil:
			used := *b.Committed
			if b.Reserved != nil {
				used += *b.Reserved
			}
			pct := ""
			if b.Limit > 0 {
				pct = fmt.Sprintf(" (%.0f%%)", 100*float64(used)/float64(b.Limit))
			}
			fmt.Fprintf(tw, "\t%d%s\t%d", used, pct, *b.Remaining)
		default:
			fmt.Fprint(tw, "\t?\t?")
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range rows {
		if b.UsageError != "" {
			_, err := fmt.Fprintf(w, "use of %s unknown: %s\n", b.ID, b.UsageError)
			return err
		}
	}
	return nil
}

func runBudgetRm(ctx context.Context, e env, args []string) error {
	fs := newFlags("budget rm")
	o := addAdminFlags(fs)
	pos, err := parseInterleaved(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("usage: sluice budget rm ID (an id from 'sluice budget list', like tenant:tokens:24h)")
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	return c.call(ctx, e, o, http.MethodDelete, "/admin/budgets/"+url.PathEscape(pos[0]), nil, nil, func(w io.Writer, data []byte) error {
		var r struct {
			Deleted  string     `json:"deleted"`
			Restored *budgetRow `json:"restored"`
		}
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		if b := r.Restored; b != nil {
			_, err := fmt.Fprintf(w, "deleted the override %s; the config's budget applies again: %d per %s (%s)\n", r.Deleted, b.Limit, b.Window, b.Mode)
			return err
		}
		_, err := fmt.Fprintf(w, "deleted the override %s; the config sets no budget with this id\n", r.Deleted)
		return err
	})
}

// ---- reservations ----

// reservationRow is one row of GET /admin/reservations.
type reservationRow struct {
	ID          string           `json:"id"`
	Tenant      string           `json:"tenant"`
	State       string           `json:"state"`
	Held        map[string]int64 `json:"held"`
	LeaseExpiry string           `json:"lease_expiry"`
	AdmittedAt  string           `json:"admitted_at"`
}

func runReservationsList(ctx context.Context, e env, args []string) error {
	fs := newFlags("reservations list")
	o := addAdminFlags(fs)
	state := fs.String("state", "", "only this state: "+strings.Join(reservationStates, "|"))
	tenant := fs.String("tenant", "", "only this tenant's reservations")
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	if *state != "" {
		if err := oneOf("state", *state, reservationStates); err != nil {
			return err
		}
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	q := url.Values{}
	if *state != "" {
		q.Set("state", *state)
	}
	if *tenant != "" {
		q.Set("tenant", *tenant)
	}
	return c.call(ctx, e, o, http.MethodGet, "/admin/reservations", q, nil, func(w io.Writer, data []byte) error {
		var rows []reservationRow
		if err := decodeInto(data, &rows); err != nil {
			return err
		}
		if len(rows) == 0 {
			_, err := fmt.Fprintln(w, "no reservations")
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTENANT\tSTATE\tHELD\tLEASE EXPIRY\tADMITTED AT")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Tenant, r.State, formatAmounts(r.Held), shortTime(r.LeaseExpiry), shortTime(r.AdmittedAt))
		}
		return tw.Flush()
	})
}

func runReservationsResolve(ctx context.Context, e env, args []string) error {
	fs := newFlags("reservations resolve")
	o := addAdminFlags(fs)
	tenant := fs.String("tenant", "", "the reservation's tenant (required)")
	charge := fs.String("charge", "", "what to charge: held|actual|zero (required)")
	actual := fs.String("actual", "", "with --charge actual: the usage, dim=N,... (e.g. tokens=1200,gpu_ms=350)")
	reason := fs.String("reason", "", "why, for the audit log (required)")
	pos, err := parseInterleaved(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("usage: sluice reservations resolve ID --tenant T --charge held|actual|zero [--actual dim=N,...] --reason TEXT")
	}
	if *tenant == "" {
		return usagef("--tenant is required")
	}
	if *charge == "" {
		return usagef("--charge is required (held|actual|zero)")
	}
	if err := oneOf("charge", *charge, []string{"held", "actual", "zero"}); err != nil {
		return err
	}
	var amounts map[string]int64
	switch {
	case *charge == "actual" && *actual == "":
		return usagef("--charge actual needs --actual dim=N,...")
	case *charge != "actual" && *actual != "":
		return usagef("--actual is only allowed with --charge actual")
	case *charge == "actual":
		if amounts, err = parseAmounts(*actual); err != nil {
			return err
		}
	}
	if strings.TrimSpace(*reason) == "" {
		return usagef("--reason is required")
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	body := struct {
		Tenant string           `json:"tenant"`
		Charge string           `json:"charge"`
		Actual map[string]int64 `json:"actual,omitempty"`
		Reason string           `json:"reason"`
	}{*tenant, *charge, amounts, *reason}
	path := "/admin/reservations/" + url.PathEscape(pos[0]) + "/resolve"
	return c.call(ctx, e, o, http.MethodPost, path, nil, body, func(w io.Writer, data []byte) error {
		var r struct {
			ID      string           `json:"id"`
			State   string           `json:"state"`
			Charged map[string]int64 `json:"charged"`
		}
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tCHARGED")
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.ID, r.State, formatAmounts(r.Charged))
		return tw.Flush()
	})
}

// parseAmounts parses "dim=N,dim=N" into amounts; each dimension must be a
// budget dimension, given once, with an integer N >= 0.
func parseAmounts(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			return nil, usagef("--actual: %q is not dim=N", part)
		}
		if err := oneOf("actual", k, budgetDimensions); err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, usagef("--actual: %s given twice", k)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, usagef("--actual: %s must be an integer >= 0, got %q", k, v)
		}
		out[k] = n
	}
	if len(out) == 0 {
		return nil, usagef("--actual: no dim=N pairs")
	}
	return out, nil
}

// formatAmounts prints the non-zero amounts as "dim=N,dim=N" in dimension
// order, or "-" when there are none.
func formatAmounts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "-"
	}
	slices.SortFunc(keys, func(a, b string) int {
		ia, ib := slices.Index(budgetDimensions, a), slices.Index(budgetDimensions, b)
		if ia < 0 {
			ia = len(budgetDimensions)
		}
		if ib < 0 {
			ib = len(budgetDimensions)
		}
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.FormatInt(m[k], 10)
	}
	return strings.Join(parts, ",")
}

// shortTime prints an RFC 3339 time to the second, in UTC; anything else
// as is, and "" as "-".
func shortTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return dash(s)
	}
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---- tenant ----

// clampRow is the Clamp the server returns.
type clampRow struct {
	Tenant          string   `json:"tenant"`
	Concurrency     *int64   `json:"concurrency"`
	Weight          *int64   `json:"weight"`
	MaxOutputTokens *int64   `json:"max_output_tokens"`
	Models          []string `json:"models"`
	Reason          string   `json:"reason"`
	ExpiresAt       string   `json:"expires_at"`
	Source          string   `json:"source"`
}

func runTenantClamp(ctx context.Context, e env, args []string) error {
	fs := newFlags("tenant clamp")
	o := addAdminFlags(fs)
	conc := fs.Int64("concurrency", 0, "at most this many requests in flight (>= 1)")
	weight := fs.Int64("weight", 0, "fair-share weight while clamped (>= 1)")
	maxOut := fs.Int64("max-output-tokens", 0, "cap on max_tokens per request (>= 1)")
	models := fs.String("models", "", "only these models, comma-separated")
	reason := fs.String("reason", "", "why, for the audit log (required)")
	dur := fs.String("for", "", "how long the clamp lasts, a positive duration like 30m (required)")
	pos, err := parseInterleaved(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("usage: sluice tenant clamp NAME [--concurrency N] [--weight N] [--max-output-tokens N] [--models a,b] --reason TEXT --for 30m")
	}
	body := struct {
		Concurrency     *int64   `json:"concurrency,omitempty"`
		Weight          *int64   `json:"weight,omitempty"`
		MaxOutputTokens *int64   `json:"max_output_tokens,omitempty"`
		Models          []string `json:"models,omitempty"`
		Reason          string   `json:"reason"`
		ExpiresIn       string   `json:"expires_in"`
	}{}
	if flagSet(fs, "concurrency") {
		// The server reads 0 as "not clamped", so 0 is refused here rather
		// than silently restricting nothing.
		if *conc < 1 {
			return usagef("--concurrency must be >= 1, got %d", *conc)
		}
		body.Concurrency = conc
	}
	if flagSet(fs, "weight") {
		if *weight < 1 {
			return usagef("--weight must be >= 1, got %d", *weight)
		}
		body.Weight = weight
	}
	if flagSet(fs, "max-output-tokens") {
		if *maxOut < 1 {
			return usagef("--max-output-tokens must be >= 1, got %d", *maxOut)
		}
		body.MaxOutputTokens = maxOut
	}
	if flagSet(fs, "models") {
		for m := range strings.SplitSeq(*models, ",") {
			if m = strings.TrimSpace(m); m != "" {
				body.Models = append(body.Models, m)
			}
		}
		if len(body.Models) == 0 {
			return usagef("--models must name at least one model")
		}
	}
	if body.Concurrency == nil && body.Weight == nil && body.MaxOutputTokens == nil && body.Models == nil {
		return usagef("nothing to clamp: give --concurrency, --weight, --max-output-tokens or --models")
	}
	if body.Reason = strings.TrimSpace(*reason); body.Reason == "" {
		return usagef("--reason is required")
	}
	if _, err := positiveDuration("for", *dur); err != nil {
		return err
	}
	body.ExpiresIn = strings.TrimSpace(*dur)
	c, err := o.client()
	if err != nil {
		return err
	}
	return c.call(ctx, e, o, http.MethodPost, "/admin/tenants/"+url.PathEscape(pos[0])+"/clamp", nil, body, func(w io.Writer, data []byte) error {
		var r clampRow
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TENANT\tCONCURRENCY\tWEIGHT\tMAX OUTPUT TOKENS\tMODELS\tEXPIRES AT\tSOURCE\tREASON")
		models := "-"
		if len(r.Models) > 0 {
			models = strings.Join(r.Models, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Tenant, optInt(r.Concurrency), optInt(r.Weight),
			optInt(r.MaxOutputTokens), models, shortTime(r.ExpiresAt), dash(r.Source), oneLine(r.Reason))
		return tw.Flush()
	})
}

func optInt(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}

func runTenantUnclamp(ctx context.Context, e env, args []string) error {
	fs := newFlags("tenant unclamp")
	o := addAdminFlags(fs)
	pos, err := parseInterleaved(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("usage: sluice tenant unclamp NAME")
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	return c.call(ctx, e, o, http.MethodDelete, "/admin/tenants/"+url.PathEscape(pos[0])+"/clamp", nil, nil, func(w io.Writer, data []byte) error {
		var r struct {
			Tenant    string `json:"tenant"`
			Unclamped bool   `json:"unclamped"`
		}
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		if !r.Unclamped {
			_, err := fmt.Fprintf(w, "%s was not clamped\n", r.Tenant)
			return err
		}
		_, err := fmt.Fprintf(w, "unclamped %s\n", r.Tenant)
		return err
	})
}
