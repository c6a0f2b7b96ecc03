package adminapi

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
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/scheduler/views"
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
	if want := a.s.StatusToken(); want != "" {
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
	want := a.s.StatusToken()
	if want == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(credOf(tok)), []byte(strings.ToLower(want))) == 1
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
	exp := a.s.Now().Add(statusSessionTTL).Unix()
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
	if err != nil || a.s.Now().Unix() >= exp {
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
func (a *Admin) status(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if len(a.token) == 0 && a.s.StatusToken() == "" {
		fail(w, http.StatusForbidden, "status_disabled", "the status page is disabled: set SLUICE_ADMIN_TOKEN or admin.status_token")
		return
	}
	if path == "/status/login" {
		a.statusLogin(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		fail(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	if r.URL.Query().Has("token") {
		fail(w, http.StatusBadRequest, "token_in_url",
			"a token is not accepted in a URL (browser history, proxy logs and Referer headers keep it): log in at /status with the form, or send Authorization: Bearer")
		return
	}
	tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	ok := bearer && a.statusAuth(tok)
	if !bearer {
		if c, err := r.Cookie(statusCookie); err == nil {
			ok = a.sessionValid(c.Value)
		}
	}
	if !ok {
		if path == "/status" {
			loginPage(w, http.StatusUnauthorized, "")
			return
		}
		fail(w, http.StatusUnauthorized, "invalid_status_token", "missing or wrong status token (Authorization: Bearer, or log in at /status)")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if path != "/status" {
		ctx, cancel := a.opContext(2 * time.Second)
		defer cancel()
		writeJSON(w, a.statusReport(ctx))
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(statusHTML)
}

// statusLogin is POST /status/login: the token from the form field or the
// Authorization header opens a session (the cookie) and redirects to
// /status.
func (a *Admin) statusLogin(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		fail(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST with the token in a form field or Authorization: Bearer")
		return
	}
	if r.URL.Query().Has("token") {
		fail(w, http.StatusBadRequest, "token_in_url", "a token is not accepted in a URL: send it in the form body or Authorization: Bearer")
		return
	}
	tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !bearer {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		tok = r.PostFormValue("token")
	}
	if !a.statusAuth(tok) {
		loginPage(w, http.StatusUnauthorized, "wrong token")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: statusCookie, Value: a.newSession(credOf(tok)), Path: statusCookiePath,
		MaxAge: int(statusSessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Cache-Control", "no-store")
	redirect(w, r, "/status", http.StatusSeeOther)
}

// loginPage answers with the login form (and why it is shown again).
func loginPage(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(bytes.Replace(statusLoginHTML, []byte("<!--msg-->"), []byte(html.EscapeString(msg)), 1))
}

// StatusReport is GET /status/report.json (and /status.json).
type StatusReport struct {
	GeneratedAt   time.Time             `json:"generated_at"`
	PolicyVersion uint64                `json:"policy_version"`
	Ready         bool                  `json:"ready"`
	ReadyReason   string                `json:"ready_reason"`
	Ledger        string                `json:"ledger"`
	GPUSource     string                `json:"gpu_source"`
	Tenants       []TenantReport        `json:"tenants"`
	Replicas      []views.ReplicaReport `json:"replicas"`
	Keys          []views.KeyReport     `json:"keys"`             // keys with budgets or a concurrency of their own
	Errors        map[string]string     `json:"errors,omitempty"` // what could not be read, e.g. a ledger snapshot
	Version       string                `json:"version"`          // module version, revision, Go version
	StartedAt     time.Time             `json:"started_at"`
	UptimeS       int64                 `json:"uptime_s"`
	ConfigFile    string                `json:"config_file"`
	// Refusals are the last 20 refused or expired requests, newest first.
	Refusals []views.Refusal `json:"refusals"`
}

// TenantReport is one tenant's row of the status page: the server's state
// and the counters of the metrics registry.
type TenantReport struct {
	views.TenantState
	Requests   map[string]int64 `json:"requests"`   // by outcome
	Rejections map[string]int64 `json:"rejections"` // by reason (error code)
	AutoClamps int64            `json:"auto_clamps"`
}

func (a *Admin) statusReport(ctx context.Context) StatusReport {
	st := views.Status(a.s.StatusState(ctx))
	r := StatusReport{GeneratedAt: st.At, PolicyVersion: st.PolicyVersion, Ready: st.Ready, ReadyReason: st.ReadyReason,
		Ledger: st.Ledger, GPUSource: st.GPUSource, Tenants: make([]TenantReport, 0, len(st.Tenants)), Replicas: st.Replicas,
		Keys: st.Keys, Errors: st.Errors, Version: buildVersion(), StartedAt: st.StartedAt,
		UptimeS: int64(st.At.Sub(st.StartedAt) / time.Second), ConfigFile: a.hooks.ConfigPath, Refusals: st.Refusals}
	counts := a.counters()
	for _, t := range st.Tenants {
		tr := TenantReport{TenantState: t, Requests: counts.requests[t.Name], Rejections: counts.rejections[t.Name], AutoClamps: counts.clamps[t.Name]}
		if tr.Requests == nil {
			tr.Requests = map[string]int64{}
		}
		if tr.Rejections == nil {
			tr.Rejections = map[string]int64{}
		}
		r.Tenants = append(r.Tenants, tr)
	}
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

// buildVersion is the binary's module version and VCS revision, as
// `sluice version` prints them.
var buildVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && len(st.Value) >= 12 {
			v += " " + st.Value[:12]
		}
	}
	return v + " " + bi.GoVersion
})
