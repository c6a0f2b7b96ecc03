package scheduler

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// The status page (docs/operations.md "Status page"): GET /status on the admin
// listener is one self-contained HTML page (no external assets) that
// renders its report, /status/report.json (also /status.json), every 2 s.
// Either the admin token or the read-only admin.status_token opens them:
// as "Authorization: Bearer <token>" on each request, or through a
// session. POST /status/login with the token in a form field (token=…)
// or in the Authorization header sets the sluice_status cookie: HttpOnly,
// SameSite=Strict, Path=/status, valid statusSessionTTL, holding an HMAC
// of its expiry and of the credential under a key of this process, never
// the token. A token in the URL is refused: it would stay in the browser's
// history, proxy logs and Referer headers. Changing either token, or a
// restart, ends the sessions it opened.

//go:embed status.html
var statusHTML []byte

//go:embed statuslogin.html
var statusLoginHTML []byte

const (
	statusCookie     = "sluice_status"
	statusCookiePath = "/status"
	statusSessionTTL = 12 * time.Hour
)

// statusCreds are the credentials that open the status page, each as the
// "sha256:<hex>" form the config stores: the admin token's and
// admin.status_token.
func (a *Admin) statusCreds() []string {
	var out []string
	if len(a.token) > 0 {
		sum := sha256.Sum256(a.token)
		out = append(out, "sha256:"+hex.EncodeToString(sum[:]))
	}
	if want := a.s.pol.Load().File.Admin.StatusToken; want != "" {
		out = append(out, strings.ToLower(want))
	}
	return out
}

// statusAuth reports whether tok is the admin or the status token.
func (a *Admin) statusAuth(tok string) bool {
	if tok == "" {
		return false
	}
	if len(a.token) > 0 && subtle.ConstantTimeCompare([]byte(tok), a.token) == 1 {
		return true
	}
	want := a.s.pol.Load().File.Admin.StatusToken
	if want == "" {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	got := "sha256:" + hex.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(got), []byte(strings.ToLower(want))) == 1
}

// credOf is the credential form (statusCreds) of a token statusAuth took.
func credOf(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// sessionMAC binds a session's expiry to one credential under the
// process's session key.
func (a *Admin) sessionMAC(exp int64, cred string) string {
	m := hmac.New(sha256.New, a.sessionKey[:])
	fmt.Fprintf(m, "sluice status session|%d|%s", exp, cred)
	return hex.EncodeToString(m.Sum(nil))
}

// newSession is a cookie value for a credential: "<expiry unix>.<mac>".
func (a *Admin) newSession(cred string) string {
	exp := a.s.now().Add(statusSessionTTL).Unix()
	return strconv.FormatInt(exp, 10) + "." + a.sessionMAC(exp, cred)
}

// sessionValid checks a cookie value: unexpired, and made for a
// credential that still opens the page.
func (a *Admin) sessionValid(v string) bool {
	e, mac, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || a.s.now().Unix() >= exp {
		return false
	}
	for _, c := range a.statusCreds() {
		if hmac.Equal([]byte(mac), []byte(a.sessionMAC(exp, c))) {
			return true
		}
	}
	return false
}

// status serves /status, /status/report.json (and /status.json) and
// /status/login.
func (a *Admin) status(rc *fasthttp.RequestCtx) {
	path := string(rc.Path())
	if len(a.token) == 0 && a.s.pol.Load().File.Admin.StatusToken == "" {
		a.fail(rc, http.StatusForbidden, "status_disabled", "the status page is disabled: set SLUICE_ADMIN_TOKEN or admin.status_token")
		return
	}
	if path == "/status/login" {
		a.statusLogin(rc)
		return
	}
	if !rc.IsGet() && !rc.IsHead() {
		a.fail(rc, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	if rc.QueryArgs().Has("token") {
		a.fail(rc, http.StatusBadRequest, "token_in_url",
			"a token is not accepted in a URL (browser history, proxy logs and Referer headers keep it): log in at /status with the form, or send Authorization: Bearer")
		return
	}
	tok, bearer := strings.CutPrefix(string(rc.Request.Header.Peek("Authorization")), "Bearer ")
	ok := bearer && a.statusAuth(tok)
	if !bearer {
		ok = a.sessionValid(string(rc.Request.Header.Cookie(statusCookie)))
	}
	if !ok {
		if path == "/status" {
			a.loginPage(rc, http.StatusUnauthorized, "")
			return
		}
		a.fail(rc, http.StatusUnauthorized, "invalid_status_token", "missing or wrong status token (Authorization: Bearer, or log in at /status)")
		return
	}
	rc.Response.Header.Set("Cache-Control", "no-store")
	if path != "/status" {
		ctx, cancel := a.opContext(2 * time.Second)
		defer cancel()
		WriteJSON(rc, a.statusReport(ctx))
		return
	}
	rc.Response.Header.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'")
	rc.SetContentType("text/html; charset=utf-8")
	rc.SetBody(statusHTML)
}

// statusLogin is POST /status/login: the token from the form field or the
// Authorization header opens a session (the cookie) and redirects to
// /status.
func (a *Admin) statusLogin(rc *fasthttp.RequestCtx) {
	if !rc.IsPost() {
		a.fail(rc, http.StatusMethodNotAllowed, "method_not_allowed", "use POST with the token in a form field or Authorization: Bearer")
		return
	}
	if rc.QueryArgs().Has("token") {
		a.fail(rc, http.StatusBadRequest, "token_in_url", "a token is not accepted in a URL: send it in the form body or Authorization: Bearer")
		return
	}
	tok, bearer := strings.CutPrefix(string(rc.Request.Header.Peek("Authorization")), "Bearer ")
	if !bearer {
		tok = string(rc.PostArgs().Peek("token"))
	}
	if !a.statusAuth(tok) {
		a.loginPage(rc, http.StatusUnauthorized, "wrong token")
		return
	}
	var c fasthttp.Cookie
	c.SetKey(statusCookie)
	c.SetValue(a.newSession(credOf(tok)))
	c.SetPath(statusCookiePath)
	c.SetMaxAge(int(statusSessionTTL / time.Second))
	c.SetHTTPOnly(true)
	c.SetSameSite(fasthttp.CookieSameSiteStrictMode)
	rc.Response.Header.SetCookie(&c)
	rc.Response.Header.Set("Cache-Control", "no-store")
	rc.Redirect("/status", http.StatusSeeOther)
}

// loginPage answers with the login form (and why it is shown again).
func (a *Admin) loginPage(rc *fasthttp.RequestCtx, status int, msg string) {
	rc.SetStatusCode(status)
	rc.Response.Header.Set("Cache-Control", "no-store")
	rc.Response.Header.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	rc.SetContentType("text/html; charset=utf-8")
	rc.SetBody(bytes.Replace(statusLoginHTML, []byte("<!--msg-->"), []byte(html.EscapeString(msg)), 1))
}

// StatusReport is GET /status.json.
type StatusReport struct {
	GeneratedAt   time.Time         `json:"generated_at"`
	PolicyVersion uint64            `json:"policy_version"`
	Ready         bool              `json:"ready"`
	ReadyReason   string            `json:"ready_reason"`
	Ledger        string            `json:"ledger"`
	GPUSource     string            `json:"gpu_source"`
	Tenants       []TenantReport    `json:"tenants"`
	Replicas      []ReplicaReport   `json:"replicas"`
	Keys          []KeyReport       `json:"keys"`             // keys with budgets or a concurrency of their own
	Errors        map[string]string `json:"errors,omitempty"` // what could not be read, e.g. a ledger snapshot
	Version       string            `json:"version"`          // module version, revision, Go version
	StartedAt     time.Time         `json:"started_at"`
	UptimeS       int64             `json:"uptime_s"`
	ConfigFile    string            `json:"config_file"`
	// Refusals are the last 20 refused or expired requests, newest first.
	Refusals []Refusal `json:"refusals"`
}

// TenantReport is one tenant's row of the status page.
type TenantReport struct {
	Name           string           `json:"name"`
	Weight         int              `json:"weight"`
	Concurrency    int              `json:"concurrency"`
	Queued         int              `json:"queued"`
	Inflight       int64            `json:"inflight"`
	InflightTokens int64            `json:"inflight_tokens"`
	Keys           int              `json:"keys"`
	Requests       map[string]int64 `json:"requests"`   // by outcome
	Rejections     map[string]int64 `json:"rejections"` // by reason (error code)
	AutoClamps     int64            `json:"auto_clamps"`
	Clamp          *Clamp           `json:"clamp"`
	Budgets        []UsageRow       `json:"budgets"`
	// The queue's bounds next to its depth: queue.max_depth and
	// queue.max_wait in force (a clamp included).
	MaxDepth int    `json:"max_depth"`
	MaxWait  string `json:"max_wait"`
	TenantOps
}

// KeyReport is one API key with limits of its own: its label (name or
// short hash, never the key), in flight on this instance and budget use.
type KeyReport struct {
	Tenant      string     `json:"tenant"`
	Label       string     `json:"label"`
	Source      string     `json:"source"` // config | admin
	Concurrency int64      `json:"concurrency,omitempty"`
	Inflight    int64      `json:"inflight"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	Budgets     []UsageRow `json:"budgets"`
}

// ReplicaReport is one replica's row of the status page.
type ReplicaReport struct {
	ReplicaStatus
	HealthFactor float64 `json:"health_factor"`
	Utilization  float64 `json:"gpu_utilization"`
	GPUCount     int     `json:"gpus"`
	KVUsage      float64 `json:"kv_usage"`
	Stale        bool    `json:"scrape_stale"`
	// StateSince is when this process saw the replica enter its state
	// (sampled each second; the process start for the first state).
	StateSince *time.Time `json:"state_since,omitempty"`
	StateForS  int64      `json:"state_for_s"`
	// LastScrapeError is the last failed poll or /v1/models read (null:
	// none since the process started).
	LastScrapeError *ScrapeErrorReport `json:"last_scrape_error"`
}

func (a *Admin) statusReport(ctx context.Context) StatusReport {
	s := a.s
	pol := s.pol.Load()
	now := s.now()
	ready, why := s.Ready()
	snap := s.gpu.Snapshot()
	r := StatusReport{GeneratedAt: now.UTC(), PolicyVersion: pol.Version, Ready: ready, ReadyReason: why,
		Ledger: pol.Cfg.Ledger.Backend, GPUSource: snap.Source, Tenants: []TenantReport{}, Replicas: []ReplicaReport{},
		Version: buildVersion(), StartedAt: s.started.UTC(), UptimeS: int64(now.Sub(s.started) / time.Second),
		ConfigFile: a.hooks.ConfigPath, Refusals: s.m.recent.recent()}
	counts := a.counters()
	rtKeys := map[string]int{}
	if idx := s.keys.Index(); idx != nil {
		for _, k := range idx.ByKey {
			rtKeys[k.Tenant]++
		}
	}
	for _, t := range pol.Order {
		tr := TenantReport{Name: t.Name, Weight: t.Cfg.Weight, Concurrency: t.Cfg.Concurrency,
			Inflight: t.RT.Inflight.Load(), InflightTokens: t.RT.InflightTokens.Load(), Keys: len(t.Keys) + rtKeys[t.Name],
			Requests: counts.requests[t.Name], Rejections: counts.rejections[t.Name], AutoClamps: counts.clamps[t.Name], Budgets: []UsageRow{},
			MaxDepth: t.Cfg.Queue.MaxDepth, MaxWait: t.Cfg.Queue.MaxWait.String(), TenantOps: s.tenantOps(t.Name)}
		if tr.Requests == nil {
			tr.Requests = map[string]int64{}
		}
		if tr.Rejections == nil {
			tr.Rejections = map[string]int64{}
		}
		if qs, ok := s.q.Stats(t.Name); ok {
			tr.Queued = qs.Depth
		}
		if c, ok := pol.ClampOf(t.Name, now); ok {
			tr.Clamp = &c
		}
		if len(t.Limits) > 1 { // more than the slots limit
			u, err := s.led.Snapshot(ctx, t.ScopeKey, t.ScopeKey)
			if err != nil {
				if r.Errors == nil {
					r.Errors = map[string]string{}
				}
				r.Errors["budgets "+t.Name] = oneLine(err)
			}
			tr.Budgets = budgetRows(t.Limits, u)
		}
		r.Tenants = append(r.Tenants, tr)
	}
	r.Keys = a.keyReports(ctx, pol, &r)
	for _, rep := range s.reps.list() {
		rr := ReplicaReport{ReplicaStatus: ReplicaStatus{Name: rep.name, URL: vllm.RedactURL(rep.url), InflightTokens: rep.load.Load(), Inflight: rep.count.Load(), State: "unknown"}}
		v, ok := snap.Replica(rep.name)
		fillReplica(&rr.ReplicaStatus, rep, v, ok)
		if ok {
			rr.HealthFactor, rr.Utilization, rr.GPUCount, rr.KVUsage, rr.Stale = v.HealthFactor, v.Utilization, v.GPUCount, v.KVUsage, v.ScrapeStale
		}
		if since, ok := s.replicaSince(rep.name); ok {
			since = since.UTC()
			rr.StateSince, rr.StateForS = &since, int64(now.Sub(since)/time.Second)
		}
		rr.LastScrapeError = rep.lastScrapeError(now)
		r.Replicas = append(r.Replicas, rr)
	}
	sort.SliceStable(r.Replicas, func(i, j int) bool { return r.Replicas[i].Name < r.Replicas[j].Name })
	return r
}

// statusCounts are the per-tenant counters the page shows, read from the
// same registry /metrics serves, so both always agree.
type statusCounts struct {
	requests, rejections map[string]map[string]int64 // tenant → label → n
	clamps               map[string]int64
}

func (a *Admin) counters() statusCounts {
	c := statusCounts{requests: map[string]map[string]int64{}, rejections: map[string]map[string]int64{}, clamps: map[string]int64{}}
	if a.gatherer == nil {
		return c
	}
	mfs, err := a.gatherer.Gather()
	if err != nil {
		return c
	}
	add := func(into map[string]map[string]int64, m *dto.Metric, key string) {
		tenant := label(m, "tenant")
		if into[tenant] == nil {
			into[tenant] = map[string]int64{}
		}
		into[tenant][label(m, key)] += int64(m.GetCounter().GetValue())
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "sluice_requests_total":
			for _, m := range mf.GetMetric() {
				add(c.requests, m, "outcome")
			}
		case "sluice_rejections_total":
			for _, m := range mf.GetMetric() {
				add(c.rejections, m, "reason")
			}
		case "sluice_abuse_clamps_total":
			for _, m := range mf.GetMetric() {
				c.clamps[label(m, "tenant")] += int64(m.GetCounter().GetValue())
			}
		}
	}
	return c
}

func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// budgetRows lists the tenant's configured budgets with the ledger's use;
// a window the ledger has not seen yet shows zero use.
func budgetRows(limits []ledger.Limit, u ledger.Usage) []UsageRow {
	rows := []UsageRow{}
	for _, l := range limits {
		if l.Dim == ledger.Slots || l == policy.ResolutionLimit {
			continue
		}
		// The limit and mode are the policy's: the ledger's copy is the
		// one of the last request, stale after a reload.
		row := UsageRow{Dimension: l.Dim.String(), Window: ledger.FormatWindow(l.Window), Limit: l.Max, Mode: l.Mode.String(), Remaining: l.Max}
		for _, ul := range u.Limits {
			if ul.Limit.Dim == l.Dim && ul.Limit.Window == l.Window {
				row.Committed, row.Reserved = ul.Committed, ul.Reserved
				row.Remaining = max(l.Max-ul.Committed-ul.Reserved, 0)
				if !ul.ResetsAt.IsZero() {
					row.ResetsAt = ul.ResetsAt.UTC().Format(time.RFC3339)
				}
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// keyReports lists the keys that have limits of their own, config keys
// first, with their ledger use.
func (a *Admin) keyReports(ctx context.Context, pol *policy.Snapshot, r *StatusReport) []KeyReport {
	keys := []*policy.Key{}
	for _, t := range pol.Order {
		keys = append(keys, t.Keys...)
	}
	if idx := a.s.keys.Index(); idx != nil {
		var rt []*policy.Key
		for _, k := range idx.ByKey {
			if pol.Tenants[k.Tenant] != nil {
				rt = append(rt, k)
			}
		}
		sort.Slice(rt, func(i, j int) bool { return rt[i].Tenant+rt[i].Label < rt[j].Tenant+rt[j].Label })
		keys = append(keys, rt...)
	}
	out := []KeyReport{}
	for _, k := range keys {
		if len(k.Scope.Limits) == 0 {
			continue
		}
		kr := KeyReport{Tenant: k.Tenant, Label: k.Label, Source: "config", Concurrency: k.Slots, Inflight: k.RT.Inflight.Load(), Budgets: []UsageRow{}}
		if k.Runtime {
			kr.Source = "admin"
		}
		if !k.ExpiresAt.IsZero() {
			e := k.ExpiresAt.UTC()
			kr.ExpiresAt = &e
		}
		t := pol.Tenants[k.Tenant]
		u, err := a.s.led.Snapshot(ctx, t.ScopeKey, k.Scope.Key)
		if err != nil {
			if r.Errors == nil {
				r.Errors = map[string]string{}
			}
			r.Errors["key budgets "+k.Tenant+"/"+k.Label] = oneLine(err)
		}
		kr.Budgets = budgetRows(k.Scope.Limits, u)
		out = append(out, kr)
	}
	return out
}
