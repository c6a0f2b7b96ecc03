package adminapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/views"
)

const adminToken = "admin-token-for-tests"

// fakeScheduler is the server as the admin API sees it: each method
// answers from its fields and records what it was asked.
type fakeScheduler struct {
	now         time.Time
	ready       bool
	statusToken string
	tenants     []string
	lists       bool // the ledger lists reservations
	usage       views.UsageIn
	budgets     []scheduler.BudgetRow
	use         map[string]views.LedgerUse // by tenant; absent: unknown

	drained  []string // "name:reason"
	budget   config.Budget
	clamp    scheduler.Clamp
	resolved scheduler.Resolution
	window   time.Duration // of the last usage read
}

var _ Scheduler = (*fakeScheduler)(nil)

func (f *fakeScheduler) Now() time.Time { return f.now }
func (f *fakeScheduler) Ready() (bool, string) {
	if f.ready {
		return true, "ready"
	}
	return false, "no replica is healthy"
}
func (f *fakeScheduler) ReadyDetail() string     { return "" }
func (f *fakeScheduler) StartDrain()             {}
func (f *fakeScheduler) PolicyVersion() uint64   { return 7 }
func (f *fakeScheduler) RestartNeeded() []string { return []string{} }
func (f *fakeScheduler) StatusToken() string     { return f.statusToken }
func (f *fakeScheduler) HasTenant(name string) bool {
	for _, t := range f.tenants {
		if t == name {
			return true
		}
	}
	return false
}
func (f *fakeScheduler) Replicas() []views.ReplicaIn {
	return []views.ReplicaIn{{Name: "r1", GPU: gpu.ReplicaView{State: gpu.StateHealthy}, Known: true}}
}
func (f *fakeScheduler) DrainReplica(name, reason string) error {
	if name != "r1" {
		return errors.New("unknown replica " + name)
	}
	f.drained = append(f.drained, name+":"+reason)
	return nil
}
func (f *fakeScheduler) Tenants() []views.TenantIn {
	out := []views.TenantIn{}
	for _, t := range f.tenants {
		out = append(out, views.TenantIn{Name: t})
	}
	return out
}
func (f *fakeScheduler) Budgets(string) []scheduler.BudgetRow {
	return append([]scheduler.BudgetRow{}, f.budgets...)
}
func (f *fakeScheduler) LedgerUse(_ context.Context, tenants []string) map[string]views.LedgerUse {
	out := map[string]views.LedgerUse{}
	for _, t := range tenants {
		if u, ok := f.use[t]; ok {
			out[t] = u
		}
	}
	return out
}
func (f *fakeScheduler) SetBudget(tenant string, b config.Budget) (scheduler.BudgetRow, error) {
	f.budget = b
	return scheduler.BudgetRow{Tenant: tenant, Limit: b.Limit}, nil
}
func (f *fakeScheduler) RemoveBudget(id string) (scheduler.BudgetRemoval, error) {
	return scheduler.BudgetRemoval{}, scheduler.ErrConfigBudget
}
func (f *fakeScheduler) SetClamp(c scheduler.Clamp) (scheduler.Clamp, error) {
	f.clamp = c
	return c, nil
}
func (f *fakeScheduler) Unclamp(string) (bool, error) { return false, nil }
func (f *fakeScheduler) CreateKey(context.Context, scheduler.KeyRequest) (scheduler.CreatedKey, error) {
	return scheduler.CreatedKey{}, errors.Join(scheduler.ErrKeyStore, errors.New("redis down\nretry"))
}
func (f *fakeScheduler) ListKeys(string) []scheduler.KeyRow { return []scheduler.KeyRow{} }
func (f *fakeScheduler) RevokeKey(context.Context, string) (scheduler.KeyRow, error) {
	return scheduler.KeyRow{}, apierr.ErrNotFound
}
func (f *fakeScheduler) ResolveReservation(_ context.Context, r scheduler.Resolution) (ledger.Settlement, error) {
	f.resolved = r
	var charged ledger.Amounts
	charged[ledger.Tokens] = r.Amounts[ledger.Tokens]
	return ledger.Settlement{State: ledger.Charged, Charged: charged}, nil
}
func (f *fakeScheduler) ListsReservations() bool { return f.lists }
func (f *fakeScheduler) Reservations(context.Context, string, ledger.State) ([]views.ReservationsIn, error) {
	return nil, nil
}
func (f *fakeScheduler) UsageCounts(window time.Duration) views.UsageIn {
	f.window = window
	return f.usage
}
func (f *fakeScheduler) StatusState(context.Context) views.StatusIn {
	return views.StatusIn{At: f.now, StartedAt: f.now.Add(-time.Minute), Tenants: []views.TenantIn{{Name: "acme"}}}
}

func newAdmin(t *testing.T, token string) (*Admin, *fakeScheduler) {
	t.Helper()
	f := &fakeScheduler{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ready: true, tenants: []string{"acme"}}
	return New(t.Context(), f, token, prometheus.NewRegistry(), Hooks{}), f
}

type answer struct {
	code   int
	header http.Header
	body   string
}

func do(a *Admin, method, target, token, body string, hdr ...string) answer {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, req)
	b, _ := io.ReadAll(w.Result().Body)
	return answer{w.Code, w.Result().Header, string(b)}
}

// TestRoutes: every path answers as the admin listener always has: a
// path outside the routes is a 404 in the error shape, never ServeMux's
// redirect into a subtree or its plain-text 405; /admin/ checks the
// token before it says whether a route exists.
func TestRoutes(t *testing.T) {
	a, f := newAdmin(t, adminToken)
	for _, tc := range []struct {
		method, path, token string
		code                int
		errCode             string
	}{
		{"GET", "/nope", "", 404, "not_found"},
		{"GET", "/admin", adminToken, 404, "not_found"},
		{"GET", "/admin/", adminToken, 404, "not_found"},
		{"GET", "/admin/nope", "", 401, "invalid_admin_token"},
		{"GET", "/admin/nope", "wrong", 401, "invalid_admin_token"},
		{"GET", "/admin/nope", adminToken, 404, "not_found"},
		{"PATCH", "/admin/keys", adminToken, 404, "not_found"},
		{"DELETE", "/admin/keys", adminToken, 404, "not_found"},
		{"DELETE", "/admin/budgets", adminToken, 404, "not_found"},
		{"POST", "/admin/replicas", adminToken, 404, "not_found"},
		{"POST", "/admin/reservations", adminToken, 404, "not_found"},
		{"PUT", "/admin/tenants", adminToken, 404, "not_found"},
		{"POST", "/admin/replicas/a/b/drain", adminToken, 404, "not_found"},
		{"POST", "/admin/replicas/r1", adminToken, 404, "not_found"},
		{"POST", "/admin/replicas/r2/drain", adminToken, 404, "not_found"},
		{"GET", "/admin/tenants/acme/clamp", adminToken, 404, "not_found"},
		{"GET", "/admin/tenants/nobody/usage", adminToken, 404, "not_found"},
		{"DELETE", "/admin/tenants/acme/clamp", adminToken, 404, "not_found"},
		{"DELETE", "/admin/keys/k1", adminToken, 404, "not_found"},
		{"DELETE", "/admin/budgets/acme:tokens:1h", adminToken, 409, "config_budget"},
		{"POST", "/admin/reload", adminToken, 501, "not_supported"},
		{"GET", "/admin/tenants", adminToken, 200, ""},
		{"GET", "/admin/tenants/acme/usage", adminToken, 200, ""},
		{"GET", "/admin/replicas", adminToken, 200, ""},
		{"GET", "/metrics", "", 200, ""},
	} {
		name := tc.method + " " + tc.path
		got := do(a, tc.method, tc.path, tc.token, "")
		require.Equal(t, tc.code, got.code, "%s: %s", name, got.body)
		assert.Equal(t, "sluice-admin", got.header.Get("Server"), name)
		if tc.errCode != "" {
			assert.Equal(t, "application/json", got.header.Get("Content-Type"), name)
			assert.Contains(t, got.body, `"code":"`+tc.errCode+`"`, name)
		}
	}

	got := do(a, "POST", "/admin/replicas/r1/drain?reason=maintenance", adminToken, "")
	assert.Equal(t, 200, got.code)
	assert.JSONEq(t, `{"replica":"r1","drained":true}`, got.body)
	got = do(a, "POST", "/admin/replicas/r1/drain", adminToken, "")
	assert.Equal(t, 200, got.code)
	got = do(a, "DELETE", "/admin/replicas/r1/drain", adminToken, "")
	assert.JSONEq(t, `{"replica":"r1","drained":false}`, got.body)
	assert.Equal(t, []string{"r1:maintenance", "r1:operator", "r1:"}, f.drained)

	got = do(a, "GET", "/", "", "")
	assert.Equal(t, http.StatusFound, got.code)
	assert.Equal(t, "http://example.com/status", got.header.Get("Location"), "absolute, on the host asked for")

	got = do(a, "GET", "/healthz", "", "")
	assert.Equal(t, "ok\n", got.body)
	assert.Equal(t, "text/plain; charset=utf-8", got.header.Get("Content-Type"))
	got = do(a, "GET", "/readyz", "", "")
	assert.Equal(t, 200, got.code)
	f.ready = false
	got = do(a, "GET", "/readyz", "", "")
	assert.Equal(t, 503, got.code)
	assert.Equal(t, "no replica is healthy\n", got.body)
}

// TestAdminDisabled: without an admin token /admin/ answers 403 and the
// probes still answer.
func TestAdminDisabled(t *testing.T) {
	a, _ := newAdmin(t, "")
	got := do(a, "GET", "/admin/tenants", "anything", "")
	assert.Equal(t, 403, got.code)
	assert.Contains(t, got.body, `"code":"admin_disabled"`)
	assert.Equal(t, 200, do(a, "GET", "/healthz", "", "").code)
	got = do(a, "GET", "/status", "", "")
	assert.Equal(t, 403, got.code)
	assert.Contains(t, got.body, `"code":"status_disabled"`)
}

// TestErrorShape: the exact bytes of an admin error, with and without a
// field path; a multi-line error is one line.
func TestErrorShape(t *testing.T) {
	a, f := newAdmin(t, adminToken)
	got := do(a, "PUT", "/admin/budgets", adminToken, `{"limit":5}`)
	assert.Equal(t, 400, got.code)
	assert.Equal(t, `{"error":{"message":"required","type":"admin_error","code":"invalid_request","param":"tenant"}}`, got.body)
	got = do(a, "PUT", "/admin/budgets", adminToken, `{"tenant":"acme","limit":5,"bogus":1}`)
	assert.Equal(t, 400, got.code)
	assert.Contains(t, got.body, `"param":"body"`, "unknown fields are refused")
	got = do(a, "GET", "/admin/nope", adminToken, "")
	assert.Equal(t, `{"error":{"message":"no such admin endpoint","type":"admin_error","code":"not_found","param":null}}`, got.body)
	got = do(a, "POST", "/admin/keys", adminToken, `{"tenant":"acme"}`)
	assert.Equal(t, 503, got.code)
	assert.Contains(t, got.body, `"code":"key_store_unavailable"`)
	assert.Contains(t, got.body, "redis down; retry")

	got = do(a, "PUT", "/admin/budgets", adminToken, `{"tenant":"acme","dimension":"tokens","limit":5,"window":"1h"}`)
	assert.Equal(t, 200, got.code)
	assert.Equal(t, "application/json", got.header.Get("Content-Type"))
	assert.True(t, strings.HasSuffix(got.body, "}\n"), "a JSON answer ends in a newline")
	assert.Equal(t, config.Budget{Dimension: "tokens", Limit: 5, Window: time.Hour}, f.budget)

	got = do(a, "POST", "/admin/tenants/acme/clamp", adminToken, `{"concurrency":1,"reason":"abuse","expires_in":"30m"}`)
	assert.Equal(t, 200, got.code)
	assert.Equal(t, f.now.Add(30*time.Minute), f.clamp.ExpiresAt, "on the server's clock")
	assert.Equal(t, "admin", f.clamp.Source)
}

// TestResolveAndReservations: the id is checked before the body; a ledger
// that cannot list answers 501 whatever the query.
func TestResolveAndReservations(t *testing.T) {
	a, f := newAdmin(t, adminToken)
	got := do(a, "POST", "/admin/reservations/00/resolve", adminToken, `not json`)
	assert.Equal(t, 400, got.code)
	assert.Contains(t, got.body, `"param":"id"`)
	id := strings.Repeat("AB", 16)
	got = do(a, "POST", "/admin/reservations/"+id+"/resolve", adminToken, `{"tenant":"acme","charge":"held","reason":"stuck"}`)
	assert.Equal(t, 200, got.code, got.body)
	assert.JSONEq(t, `{"id":"`+id+`","state":"charged","charged":{"requests":0,"tokens":0,"input_tokens":0,"output_tokens":0,"gpu_ms":0,"gpu_joules":0,"usd_micros":0}}`, got.body)
	assert.Equal(t, scheduler.Resolution{Tenant: "acme", ID: id, Charge: "held", Reason: "stuck"}, f.resolved)

	// At actual amounts, by dimension name: tokens default to input + output.
	got = do(a, "POST", "/admin/reservations/"+id+"/resolve", adminToken, `{"tenant":"acme","charge":"actual","actual":{"input_tokens":3,"output_tokens":4},"reason":"r"}`)
	require.Equal(t, 200, got.code, got.body)
	var want ledger.Amounts
	want[ledger.InputTokens], want[ledger.OutputTokens], want[ledger.Tokens] = 3, 4, 7
	assert.Equal(t, want, f.resolved.Amounts)
	assert.Contains(t, got.body, `"tokens":7`)
	f.resolved = scheduler.Resolution{}
	for body, param := range map[string]string{
		`{"tenant":"nobody","charge":"some","reason":"r"}`:                        "tenant",
		`{"tenant":"acme","charge":"some"}`:                                       "reason",
		`{"tenant":"acme","charge":"some","reason":"r"}`:                          "charge",
		`{"tenant":"acme","charge":"actual","actual":{"slots":1},"reason":"r"}`:   "actual.slots",
		`{"tenant":"acme","charge":"actual","actual":{"tokens":-1},"reason":"r"}`: "actual",
	} {
		got = do(a, "POST", "/admin/reservations/"+id+"/resolve", adminToken, body)
		assert.Equal(t, 400, got.code, body)
		assert.Contains(t, got.body, `"param":"`+param+`"`, body)
	}
	assert.Zero(t, f.resolved, "a bad request never reaches the server")

	got = do(a, "GET", "/admin/reservations?state=bogus", adminToken, "")
	assert.Equal(t, 501, got.code)
	f.lists = true
	got = do(a, "GET", "/admin/reservations?state=bogus", adminToken, "")
	assert.Equal(t, 400, got.code)
	assert.Contains(t, got.body, `"param":"state"`)
	assert.Equal(t, "[]\n", do(a, "GET", "/admin/reservations", adminToken, "").body)
}

// TestUsageCSV: the CSV columns and rows, chosen by ?format= or Accept.
func TestUsageCSV(t *testing.T) {
	a, f := newAdmin(t, adminToken)
	since := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	f.usage = views.UsageIn{Started: since, Now: since.Add(time.Hour), Dims: lifecycle.UsageDimensions(), Counts: []views.UsageCount{
		{Tenant: "acme", Key: "k1", Model: "m", Values: []int64{3, 0, 40, 0, 0, 0, 0}},
	}}
	want := "since,until,tenant,key,model," + strings.Join(lifecycle.UsageDimensions(), ",") + "\n"
	for _, ask := range []struct{ query, accept string }{{"?format=csv", ""}, {"", "text/csv"}} {
		got := do(a, "GET", "/admin/usage"+ask.query, adminToken, "", "Accept", ask.accept)
		require.Equal(t, 200, got.code, got.body)
		assert.Equal(t, "text/csv; charset=utf-8", got.header.Get("Content-Type"))
		lines := strings.SplitN(got.body, "\n", 2)
		require.Len(t, lines, 2)
		assert.Equal(t, want, lines[0]+"\n")
		assert.True(t, strings.HasPrefix(lines[1], "2026-01-02T00:00:00Z,2026-01-02T01:00:00Z,acme,k1,m,3,"), lines[1])
	}
	got := do(a, "GET", "/admin/usage?tenant=acme&dimension=requests&window=24h", adminToken, "")
	assert.Equal(t, 200, got.code)
	assert.Equal(t, 24*time.Hour, f.window)
	assert.Contains(t, got.body, `"rows":[{"tenant":"acme","key":"k1","model":"m","usage":{"requests":3}}]`, "only the tenant's rows, in the dimension asked")
	for q, param := range map[string]string{"tenant=nobody": "tenant", "dimension=watts": "dimension", "window=745h": "window", "format=xml": "format"} {
		got := do(a, "GET", "/admin/usage?"+q, adminToken, "")
		assert.Equal(t, 400, got.code, q)
		assert.Contains(t, got.body, `"param":"`+param+`"`, q)
	}
}

// TestStatusSession: a login sets a cookie that opens the report until it
// expires on the server's clock; the report carries the snapshot.
func TestStatusSession(t *testing.T) {
	a, f := newAdmin(t, adminToken)
	got := do(a, "POST", "/status/login", "", url.Values{"token": {adminToken}}.Encode(), "Content-Type", "application/x-www-form-urlencoded")
	require.Equal(t, http.StatusSeeOther, got.code, got.body)
	assert.Equal(t, "http://example.com/status", got.header.Get("Location"))
	assert.Equal(t, "no-store", got.header.Get("Cache-Control"))
	cookies := (&http.Response{Header: got.header}).Cookies()
	require.Len(t, cookies, 1)
	c := cookies[0]
	assert.Equal(t, "sluice_status", c.Name)
	assert.Equal(t, "/status", c.Path)
	assert.True(t, c.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, c.SameSite)
	assert.Equal(t, 12*3600, c.MaxAge)

	got = do(a, "GET", "/status/report.json", "", "", "Cookie", "sluice_status="+c.Value)
	require.Equal(t, 200, got.code, got.body)
	assert.Equal(t, "no-store", got.header.Get("Cache-Control"))
	assert.Contains(t, got.body, `"uptime_s":60`)
	assert.Contains(t, got.body, `"name":"acme"`)
	assert.Contains(t, got.body, `"requests":{}`)

	page := do(a, "GET", "/status", "", "", "Cookie", "sluice_status="+c.Value)
	assert.Equal(t, 200, page.code)
	assert.Equal(t, "text/html; charset=utf-8", page.header.Get("Content-Type"))
	assert.NotEmpty(t, page.header.Get("Content-Security-Policy"))
	assert.Equal(t, 405, do(a, "POST", "/status", adminToken, "").code)

	f.now = f.now.Add(12 * time.Hour)
	got = do(a, "GET", "/status", "", "", "Cookie", "sluice_status="+c.Value)
	assert.Equal(t, 401, got.code, "the session has expired")
	assert.Contains(t, got.body, "<form", "the login form again")
}

// TestBudgetsInUse: each budget row carries its use in the current
// window from its tenant's ledger snapshot; a failed snapshot names its
// error on the tenant's rows, and a row whose use is unknown has none.
func TestBudgetsInUse(t *testing.T) {
	a, f := newAdmin(t, adminToken)
	f.budgets = []scheduler.BudgetRow{
		{ID: "g", Tenant: "_global", Dimension: "requests", Limit: 10, Window: "1h0m0s"},
		{ID: "a", Tenant: "acme", Dimension: "tokens", Limit: 100, Window: "1h0m0s"},
		{ID: "a2", Tenant: "acme", Dimension: "tokens", Limit: 100, Window: "24h0m0s"},
		{ID: "b", Tenant: "beta", Dimension: "tokens", Limit: 100, Window: "1h0m0s"},
		{ID: "x", Tenant: "gone", Dimension: "tokens", Limit: 100, Window: "1h0m0s"},
	}
	tokens := ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 5}
	f.use = map[string]views.LedgerUse{
		"_global": {},
		"acme":    {Usage: ledger.Usage{Limits: []ledger.LimitUsage{{Limit: tokens, Committed: 60, Reserved: 50, ResetsAt: time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)}}}},
		"beta":    {Err: errors.New("ledger unreachable\nretry")},
	}
	got := do(a, "GET", "/admin/budgets", adminToken, "")
	require.Equal(t, 200, got.code, got.body)
	assert.JSONEq(t, `[
		{"id":"g","tenant":"_global","dimension":"requests","limit":10,"window":"1h0m0s","mode":"","source":"","committed":0,"reserved":0,"remaining":10},
		{"id":"a","tenant":"acme","dimension":"tokens","limit":100,"window":"1h0m0s","mode":"","source":"","committed":60,"reserved":50,"remaining":0,"resets_at":"2026-01-02T04:00:00Z"},
		{"id":"a2","tenant":"acme","dimension":"tokens","limit":100,"window":"24h0m0s","mode":"","source":"","committed":0,"reserved":0,"remaining":100},
		{"id":"b","tenant":"beta","dimension":"tokens","limit":100,"window":"1h0m0s","mode":"","source":"","usage_error":"ledger unreachable; retry"},
		{"id":"x","tenant":"gone","dimension":"tokens","limit":100,"window":"1h0m0s","mode":"","source":""}
	]`, got.body)
}
