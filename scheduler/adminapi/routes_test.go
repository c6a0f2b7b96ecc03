package adminapi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/views"
)

// callLog is the fake server recording each call that takes an argument
// from the request, so a route's test sees what its path was read as.
type callLog struct {
	*fakeScheduler
	calls []string
}

func (c *callLog) log(f string, a ...any) { c.calls = append(c.calls, fmt.Sprintf(f, a...)) }
func (c *callLog) HasTenant(n string) bool {
	c.log("HasTenant(%s)", n)
	return c.fakeScheduler.HasTenant(n)
}
func (c *callLog) DrainReplica(n, r string) error {
	c.log("DrainReplica(%s,%s)", n, r)
	return c.fakeScheduler.DrainReplica(n, r)
}
func (c *callLog) Budgets(t string) []scheduler.BudgetRow {
	c.log("Budgets(%s)", t)
	return c.fakeScheduler.Budgets(t)
}
func (c *callLog) SetBudget(t string, b config.Budget) (scheduler.BudgetRow, error) {
	c.log("SetBudget(%s)", t)
	return c.fakeScheduler.SetBudget(t, b)
}
func (c *callLog) RemoveBudget(id string) (scheduler.BudgetRemoval, error) {
	c.log("RemoveBudget(%s)", id)
	return c.fakeScheduler.RemoveBudget(id)
}
func (c *callLog) SetClamp(x scheduler.Clamp) (scheduler.Clamp, error) {
	c.log("SetClamp(%s)", x.Tenant)
	return c.fakeScheduler.SetClamp(x)
}
func (c *callLog) Unclamp(t string) (bool, error) {
	c.log("Unclamp(%s)", t)
	return c.fakeScheduler.Unclamp(t)
}
func (c *callLog) CreateKey(ctx context.Context, in scheduler.KeyRequest) (scheduler.CreatedKey, error) {
	c.log("CreateKey(%s)", in.Tenant)
	return c.fakeScheduler.CreateKey(ctx, in)
}
func (c *callLog) ListKeys(t string) []scheduler.KeyRow {
	c.log("ListKeys(%s)", t)
	return c.fakeScheduler.ListKeys(t)
}
func (c *callLog) RevokeKey(ctx context.Context, id string) (scheduler.KeyRow, error) {
	c.log("RevokeKey(%s)", id)
	return c.fakeScheduler.RevokeKey(ctx, id)
}
func (c *callLog) ResolveReservation(ctx context.Context, r scheduler.Resolution) (ledger.Settlement, error) {
	c.log("Resolve(%s)", r.ID)
	return c.fakeScheduler.ResolveReservation(ctx, r)
}
func (c *callLog) Reservations(ctx context.Context, t string, s ledger.State) ([]views.ReservationsIn, error) {
	c.log("Reservations(%s)", t)
	return c.fakeScheduler.Reservations(ctx, t, s)
}

// TestRouteTable: each admin path and method answers with its status and
// message (a 404 names the shape the endpoint under that path wants, or
// says there is no endpoint), reads its arguments from the path's
// segments, and asks for the admin token before it says anything. An
// escaped slash (%2F) is part of a segment, never a separator: a name
// holding one is a path of another shape.
func TestRouteTable(t *testing.T) {
	const (
		none   = "no such admin endpoint"
		unauth = "missing or wrong admin token"
		drain  = "use /admin/replicas/{name}/drain"
		usage  = "use /admin/tenants/{name}/usage with a configured tenant"
		clamp  = "use /admin/tenants/{name}/clamp"
		revoke = "use DELETE /admin/keys/{id}"
		badID  = "must be a 32-hex-digit ledger request id"
	)
	id := strings.Repeat("ab", 16)
	// A body each route takes, by the path's end (an escaped slash
	// included, to see what an old reading of such a path would do).
	bodyFor := func(path string) string {
		p, _, _ := strings.Cut(path, "?")
		switch {
		case p == "/admin/keys":
			return `{"tenant":"acme"}`
		case p == "/admin/budgets":
			return `{"tenant":"acme","dimension":"tokens","limit":5,"window":"1h"}`
		case strings.HasSuffix(p, "clamp"):
			return `{"concurrency":1,"reason":"r","expires_in":"30m"}`
		case strings.HasSuffix(p, "resolve"):
			return `{"tenant":"acme","charge":"held","reason":"r"}`
		}
		return ""
	}
	for _, tc := range []struct {
		method, path string
		token        string // "-": none
		code         int
		msg          string // the error's message, or where the answer is redirected
		calls        string // the server calls, "; "-separated
	}{
		{"GET", "/admin", "", 404, "no such endpoint", ""},
		{"GET", "/admin/", "", 404, none, ""},
		{"GET", "/admin/nope", "", 404, none, ""},
		{"GET", "/admin/nope", "-", 401, unauth, ""},
		{"GET", "/admin/nope", "wrong", 401, unauth, ""},
		{"POST", "/admin/replicas/r1/drain", "-", 401, unauth, ""},
		{"GET", "/admin/tenants", "status-tok", 401, unauth, ""},

		{"POST", "/admin/drain", "", 200, "", ""},
		{"GET", "/admin/drain", "", 404, none, ""},
		{"POST", "/admin/drain/", "", 404, none, ""},
		{"POST", "/admin/reload", "", 501, "reload is not wired", ""},
		{"GET", "/admin/reload", "", 404, none, ""},
		{"POST", "/admin/reload/x", "", 404, none, ""},

		{"GET", "/admin/replicas", "", 200, "", ""},
		{"HEAD", "/admin/replicas", "", 200, "", ""},
		{"POST", "/admin/replicas", "", 404, none, ""},
		{"DELETE", "/admin/replicas", "", 404, none, ""},
		{"GET", "/admin/replicas/", "", 404, none, ""},
		{"POST", "/admin/replicas/r1/drain", "", 200, "", "DrainReplica(r1,operator)"},
		{"POST", "/admin/replicas/r1/drain?reason=maint", "", 200, "", "DrainReplica(r1,maint)"},
		{"DELETE", "/admin/replicas/r1/drain?reason=maint", "", 200, "", "DrainReplica(r1,)"},
		{"POST", "/admin/replicas/r%31/drain", "", 200, "", "DrainReplica(r1,operator)"},
		{"POST", "/admin/replicas/r2/drain", "", 404, "unknown replica r2", "DrainReplica(r2,operator)"},
		{"GET", "/admin/replicas/r1/drain", "", 404, none, ""},
		{"PUT", "/admin/replicas/r1/drain", "", 404, none, ""},
		{"POST", "/admin/replicas/", "", 404, drain, ""},
		{"DELETE", "/admin/replicas/", "", 404, drain, ""},
		{"POST", "/admin/replicas/r1", "", 404, drain, ""},
		{"POST", "/admin/replicas/r1/", "", 404, drain, ""},
		{"POST", "/admin/replicas/r1/unknown", "", 404, drain, ""},
		{"DELETE", "/admin/replicas/r1/drain/", "", 404, drain, ""},
		{"POST", "/admin/replicas/r1/drain/x", "", 404, drain, ""},
		{"POST", "/admin/replicas/a/b/drain", "", 404, drain, ""},
		{"POST", "/admin/replicas/a%2Fb/drain", "", 404, drain, ""},
		{"POST", "/admin/replicas/r1%2Fdrain", "", 404, drain, ""},
		{"DELETE", "/admin/replicas/r1%2Fdrain", "", 404, drain, ""},
		{"POST", "/admin/replicas%2Fr1/drain", "", 404, none, ""},

		{"GET", "/admin/tenants", "", 200, "", ""},
		{"POST", "/admin/tenants", "", 404, none, ""},
		{"DELETE", "/admin/tenants", "", 404, none, ""},
		{"PUT", "/admin/tenants", "", 404, none, ""},
		{"GET", "/admin/tenants/acme/usage", "", 200, "", "HasTenant(acme)"},
		{"GET", "/admin/tenants/%61cme/usage", "", 200, "", "HasTenant(acme)"},
		{"GET", "/admin/tenants/nobody/usage", "", 404, usage, "HasTenant(nobody)"},
		{"GET", "/admin/tenants/", "", 404, usage, ""},
		{"GET", "/admin/tenants/acme", "", 404, usage, ""},
		{"GET", "/admin/tenants/acme/", "", 404, usage, ""},
		{"GET", "/admin/tenants/acme/usage/", "", 404, usage, ""},
		{"GET", "/admin/tenants/acme/clamp", "", 404, usage, ""},
		{"GET", "/admin/tenants/x/y/z", "", 404, usage, ""},
		{"GET", "/admin/tenants/a%2Fb/usage", "", 404, usage, ""},
		{"GET", "/admin/tenants/acme%2Fusage", "", 404, usage, ""},
		{"PUT", "/admin/tenants/acme/usage", "", 404, none, ""},
		{"POST", "/admin/tenants/acme/clamp", "", 200, "", "SetClamp(acme)"},
		{"DELETE", "/admin/tenants/acme/clamp", "", 404, "tenant acme has no clamp", "Unclamp(acme)"},
		{"POST", "/admin/tenants/", "", 404, clamp, ""},
		{"DELETE", "/admin/tenants/", "", 404, clamp, ""},
		{"POST", "/admin/tenants/acme/usage", "", 404, clamp, ""},
		{"POST", "/admin/tenants/acme/clamp/", "", 404, clamp, ""},
		{"DELETE", "/admin/tenants/acme/clamp/x", "", 404, clamp, ""},
		{"POST", "/admin/tenants/acme%2Fclamp", "", 404, clamp, ""},
		{"DELETE", "/admin/tenants/acme%2Fclamp", "", 404, clamp, ""},
		{"POST", "/admin/tenants/a%2Fb/clamp", "", 404, clamp, ""},
		{"PATCH", "/admin/tenants/acme/clamp", "", 404, none, ""},

		{"POST", "/admin/keys", "", 503, "key store unavailable; redis down; retry", "CreateKey(acme)"},
		{"GET", "/admin/keys?tenant=acme", "", 200, "", "ListKeys(acme)"},
		{"DELETE", "/admin/keys", "", 404, none, ""},
		{"PATCH", "/admin/keys", "", 404, none, ""},
		{"OPTIONS", "/admin/keys", "", 404, none, ""},
		{"GET", "/admin/keys/", "", 404, none, ""},
		{"DELETE", "/admin/keys/k1", "", 404, "not found", "RevokeKey(k1)"},
		{"DELETE", "/admin/keys/%6B1", "", 404, "not found", "RevokeKey(k1)"},
		{"GET", "/admin/keys/k1", "", 404, none, ""},
		{"DELETE", "/admin/keys/", "", 404, revoke, ""},
		{"DELETE", "/admin/keys/k1/", "", 404, revoke, ""},
		{"DELETE", "/admin/keys/a/b", "", 404, revoke, ""},
		{"DELETE", "/admin/keys/a%2Fb", "", 404, revoke, ""},

		{"GET", "/admin/budgets?tenant=acme", "", 200, "", "Budgets(acme)"},
		{"PUT", "/admin/budgets", "", 200, "", "SetBudget(acme)"},
		{"POST", "/admin/budgets", "", 404, none, ""},
		{"DELETE", "/admin/budgets", "", 404, none, ""},
		{"GET", "/admin/budgets/", "", 404, none, ""},
		{"GET", "/admin/budgets/acme:tokens:1h", "", 404, none, ""},
		// RemoveBudget judges any id: what follows the prefix, unescaped.
		{"DELETE", "/admin/budgets/acme:tokens:1h", "", 409, "the budget comes from the config file", "RemoveBudget(acme:tokens:1h)"},
		{"DELETE", "/admin/budgets/", "", 409, "the budget comes from the config file", "RemoveBudget()"},
		{"DELETE", "/admin/budgets/a/b/c", "", 409, "the budget comes from the config file", "RemoveBudget(a/b/c)"},
		{"DELETE", "/admin/budgets/a%2Fb", "", 409, "the budget comes from the config file", "RemoveBudget(a/b)"},
		{"DELETE", "/admin/budgets/acme:tokens:1h/", "", 409, "the budget comes from the config file", "RemoveBudget(acme:tokens:1h/)"},

		{"GET", "/admin/reservations", "", 501, "this ledger backend cannot list reservations yet; resolve by the id in the audit trail or logs", ""},
		{"POST", "/admin/reservations", "", 404, none, ""},
		{"POST", "/admin/reservations/" + id + "/resolve", "", 200, "", "HasTenant(acme); Resolve(" + id + ")"},
		{"GET", "/admin/reservations/" + id + "/resolve", "", 404, none, ""},
		{"POST", "/admin/reservations/", "", 400, badID, ""},
		{"POST", "/admin/reservations/" + id, "", 400, badID, ""},
		{"POST", "/admin/reservations/" + id + "/resolve/", "", 400, badID, ""},
		{"POST", "/admin/reservations/" + id + "/x/resolve", "", 400, badID, ""},
		{"POST", "/admin/reservations/00/resolve", "", 400, badID, ""},
		{"POST", "/admin/reservations/" + id + "%2Fresolve", "", 400, badID, ""},

		{"GET", "/admin/usage", "", 200, "", ""},
		{"POST", "/admin/usage", "", 404, none, ""},
		{"GET", "/admin/usage/", "", 404, none, ""},

		// ServeMux redirects a path that is not clean, before any route.
		{"GET", "/admin//keys", "-", 307, "/admin/keys", ""},
		{"DELETE", "/admin/keys/../tenants", "-", 307, "/admin/tenants", ""},
	} {
		name := tc.method + " " + tc.path + " " + tc.token
		_, f := newAdmin(t, adminToken)
		f.statusToken = credOf("status-tok")
		c := &callLog{fakeScheduler: f}
		a := New(t.Context(), c, adminToken, prometheus.NewRegistry(), Hooks{})
		token := tc.token
		switch token {
		case "":
			token = adminToken
		case "-":
			token = ""
		}
		got := do(a, tc.method, tc.path, token, bodyFor(tc.path))
		assert.Equal(t, tc.code, got.code, "%s: %s", name, got.body)
		assert.Equal(t, tc.calls, strings.Join(c.calls, "; "), name)
		switch {
		case tc.code == 307:
			assert.Equal(t, tc.msg, got.header.Get("Location"), name)
		case tc.code >= 400:
			assert.Equal(t, "application/json", got.header.Get("Content-Type"), name)
			assert.Contains(t, got.body, `"message":"`+tc.msg+`"`, name)
		}
	}
}
