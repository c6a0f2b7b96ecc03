// Package adminapi serves the admin listener: /metrics, /healthz, /readyz,
// the admin API under /admin/ and the status page under /status
// (docs/operations.md). It is plain net/http: the admin listener carries
// a few operator requests a minute, where fasthttp's zero-allocation
// design buys nothing and its recycled request contexts cost care (a
// context or a slice kept past the handler is a data race); net/http's
// ServeMux gives method patterns, http.Server a Shutdown that waits for
// the requests in flight, and httptest unit tests without a listener.
//
// It reads and changes the server only through [Scheduler], the exported,
// value-returning methods of *scheduler.Server: imports point one way,
// from this package to package scheduler. What it shows is built by
// package scheduler/views from the copies those methods return.
package adminapi

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/plainjson"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/views"
)

// Scheduler is what the admin API reads and changes of the server;
// *scheduler.Server implements it. Every method returns values (copies),
// never the server's own state; the views (package scheduler/views) are
// built from them here.
type Scheduler interface {
	Now() time.Time
	Ready() (bool, string)
	ReadyDetail() string
	StartDrain()
	PolicyVersion() uint64
	RestartNeeded() []string
	StatusToken() string
	HasTenant(name string) bool

	Replicas() []views.ReplicaIn
	DrainReplica(name, reason string) error
	Tenants() []views.TenantIn

	Budgets(tenant string) []scheduler.BudgetRow
	LedgerUse(ctx context.Context, tenants []string) map[string]views.LedgerUse
	SetBudget(tenant string, b config.Budget) (scheduler.BudgetRow, error)
	RemoveBudget(id string) (scheduler.BudgetRemoval, error)
	SetClamp(c scheduler.Clamp) (scheduler.Clamp, error)
	Unclamp(tenant string) (bool, error)

	CreateKey(ctx context.Context, in scheduler.KeyRequest) (scheduler.CreatedKey, error)
	ListKeys(tenant string) []scheduler.KeyRow
	RevokeKey(ctx context.Context, id string) (scheduler.KeyRow, error)

	ResolveReservation(ctx context.Context, r scheduler.Resolution) (ledger.Settlement, error)
	ListsReservations() bool
	Reservations(ctx context.Context, tenant string, state ledger.State) ([]views.ReservationsIn, error)
	UsageCounts(window time.Duration) views.UsageIn
	StatusState(ctx context.Context) views.StatusIn
}

var _ Scheduler = (*scheduler.Server)(nil)

// Hooks are the process-level actions the admin API can trigger.
type Hooks struct {
	// Reload re-reads and applies the config file.
	Reload func() error
	// Drain starts a graceful shutdown.
	Drain func()
	// ConfigPath is the config file the process reads ("" none), shown
	// on the status page.
	ConfigPath string
}

// Admin serves /metrics and the admin API on the admin listener. Every
// /admin/ call needs "Authorization: Bearer $SLUICE_ADMIN_TOKEN"; with no
// token configured the admin API is disabled (403) and only /metrics,
// /healthz and /readyz answer.
type Admin struct {
	s     Scheduler
	base  context.Context // parent of every operation's context (opContext)
	token []byte
	hooks Hooks
	mux   *http.ServeMux
	// gatherer feeds the status page the counters /metrics serves.
	gatherer prometheus.Gatherer
	// sessionKey signs status page sessions (status.go); random per
	// process, so a restart ends them.
	sessionKey [32]byte
}

// New builds the admin handler. base is the parent of every operation's
// context (the server's lifetime, as the edge's).
func New(base context.Context, s Scheduler, token string, g prometheus.Gatherer, hooks Hooks) *Admin {
	a := &Admin{s: s, base: base, token: []byte(token), hooks: hooks, gatherer: g, mux: http.NewServeMux()}
	if _, err := rand.Read(a.sessionKey[:]); err != nil {
		panic("crypto/rand: " + err.Error()) // never fails on supported platforms
	}
	// The paths outside /admin/ answer any method, as they always have.
	a.mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	a.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "ok\n") })
	a.mux.HandleFunc("/readyz", a.readyz)
	for _, p := range []string{"/status", "/status.json", "/status/report.json", "/status/login"} {
		a.mux.HandleFunc(p, a.status)
	}
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			// The listener's root is where an operator's browser lands first.
			redirect(w, r, "/status", http.StatusFound)
			return
		}
		fail(w, http.StatusNotFound, "not_found", "no such endpoint")
	})
	// Without this, ServeMux would redirect /admin to /admin/.
	a.mux.HandleFunc("/admin", func(w http.ResponseWriter, _ *http.Request) {
		fail(w, http.StatusNotFound, "not_found", "no such endpoint")
	})

	// Each admin endpoint: its method and shape. A handler reads its
	// arguments with PathValue.
	routes := []route{
		{"POST /admin/drain", a.drain},
		{"POST /admin/reload", a.reload},
		{"GET /admin/replicas", a.replicas},
		// Drain a replica (it finishes what it runs and gets nothing
		// new; ?reason=…); DELETE undrains it.
		{"POST /admin/replicas/{name}/drain", a.drainReplica},
		{"DELETE /admin/replicas/{name}/drain", a.undrainReplica},
		{"GET /admin/tenants", a.tenants},
		{"GET /admin/tenants/{name}/usage", a.tenantUsage},
		{"POST /admin/tenants/{name}/clamp", a.clamp},
		{"DELETE /admin/tenants/{name}/clamp", a.unclamp},
		// Run-time keys: create (answers the key once), list (?tenant=,
		// never a secret), revoke.
		{"POST /admin/keys", a.createKey},
		{"GET /admin/keys", a.listKeys},
		{"DELETE /admin/keys/{id}", a.revokeKey},
		{"GET /admin/budgets", a.listBudgets},
		{"PUT /admin/budgets", a.putBudget},
		// The id is the rest of the path, slashes included:
		// RemoveBudget judges it, as it judges any other spelling.
		{"DELETE /admin/budgets/{id...}", a.deleteBudget},
		{"GET /admin/reservations", a.listReservations},
		{"POST /admin/reservations/{id}/resolve", a.resolve},
		{"GET /admin/usage", a.usage},

		// Another path under an endpoint, with the endpoint's method,
		// is answered with the shape the endpoint wants.
		{"POST /admin/replicas/", notFound(useDrain)},
		{"DELETE /admin/replicas/", notFound(useDrain)},
		{"GET /admin/tenants/", notFound(useUsage)},
		{"POST /admin/tenants/", notFound(useClamp)},
		{"DELETE /admin/tenants/", notFound(useClamp)},
		{"DELETE /admin/keys/", notFound(useRevoke)},
		// A resolve's path holds only the id: any other is a bad id.
		{"POST /admin/reservations/", badReservationID},
	}
	registered := map[string]bool{}
	for _, rt := range routes {
		a.mux.Handle(rt.pattern, a.authed(rt.h))
		registered[rt.pattern] = true
	}
	// A subtree's root without its slash, for the same method, is no
	// endpoint: ServeMux would otherwise redirect it into the subtree.
	for _, rt := range routes {
		if i := strings.LastIndexByte(rt.pattern, '/'); rt.pattern[i+1:] == "" || strings.HasSuffix(rt.pattern, "...}") {
			if root := rt.pattern[:i]; !registered[root] {
				a.mux.Handle(root, a.authed(notFound(noEndpoint)))
				registered[root] = true
			}
		}
	}
	// Any other /admin/ path or method: authenticated first, then 404,
	// so a caller without the token learns nothing of the routes.
	a.mux.Handle("/admin/", a.authed(notFound(noEndpoint)))
	return a
}

// HTTPServer returns the admin listener's server.
func (a *Admin) HTTPServer() *http.Server {
	return &http.Server{Handler: a, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
}

// ServeHTTP routes admin-listener requests.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Server", "sluice-admin")
	a.mux.ServeHTTP(w, r)
}

func (a *Admin) readyz(w http.ResponseWriter, _ *http.Request) {
	ok, why := a.s.Ready()
	status := http.StatusOK
	if !ok {
		status = http.StatusServiceUnavailable
	} else if d := a.s.ReadyDetail(); d != "" {
		why += "\n" + d
	}
	writeText(w, status, why+"\n")
}

// authed admits a request with the admin token.
func (a *Admin) authed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(a.token) == 0 {
			fail(w, http.StatusForbidden, "admin_disabled", "the admin API is disabled: set SLUICE_ADMIN_TOKEN")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), a.token) != 1 {
			fail(w, http.StatusUnauthorized, "invalid_admin_token", "missing or wrong admin token")
			return
		}
		h(w, r)
	})
}

// route is one admin pattern and its handler.
type route struct {
	pattern string
	h       http.HandlerFunc
}

// What a 404 says: no endpoint, or the shape the endpoint under that
// path wants.
const (
	noEndpoint = "no such admin endpoint"
	useDrain   = "use /admin/replicas/{name}/drain"
	useUsage   = "use /admin/tenants/{name}/usage with a configured tenant"
	useClamp   = "use /admin/tenants/{name}/clamp"
	useRevoke  = "use DELETE /admin/keys/{id}"
)

func notFound(msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { fail(w, http.StatusNotFound, "not_found", msg) }
}

// pathName is the {key} wildcard of r's path; ok is false if it holds a
// slash. Names and ids never do, and an escaped one (%2F) is a path of
// another shape, answered as a literal slash there is.
func pathName(r *http.Request, key string) (name string, ok bool) {
	name = r.PathValue(key)
	return name, !strings.Contains(name, "/")
}

// fail writes an admin error in the pinned shape (apierr's, with type
// admin_error).
func fail(w http.ResponseWriter, status int, code, msg string) {
	failParam(w, status, code, msg, "")
}

func failParam(w http.ResponseWriter, status int, code, msg, param string) {
	b := (&apierr.Error{Status: status, Code: code, Type: "admin_error", Message: msg, Param: param}).Body(false)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeJSON writes v as a 200 JSON response.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := plainjson.Marshal(v)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// redirect answers with an absolute Location on the host the client
// asked for, as the admin listener always has.
func redirect(w http.ResponseWriter, r *http.Request, path string, status int) {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	w.Header().Set("Location", scheme+"://"+r.Host+path)
	writeText(w, status, "")
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func (a *Admin) drain(w http.ResponseWriter, _ *http.Request) {
	a.s.StartDrain()
	if a.hooks.Drain != nil {
		a.hooks.Drain()
	}
	writeJSON(w, map[string]string{"status": "draining"})
}

func (a *Admin) reload(w http.ResponseWriter, _ *http.Request) {
	if a.hooks.Reload == nil {
		fail(w, http.StatusNotImplemented, "not_supported", "reload is not wired")
		return
	}
	if err := a.hooks.Reload(); err != nil {
		fail(w, http.StatusBadRequest, "invalid_config", oneLine(err))
		return
	}
	// restart_needed: restart-only fields (listen, ledger, replicas, ...)
	// the file changes; they keep their start-up value until a restart.
	writeJSON(w, map[string]any{"status": "reloaded", "version": a.s.PolicyVersion(), "restart_needed": a.s.RestartNeeded()})
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

func (a *Admin) replicas(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, views.ReplicaStatuses(a.s.Replicas()))
}

// drainReplica is POST /admin/replicas/{name}/drain?reason=….
func (a *Admin) drainReplica(w http.ResponseWriter, r *http.Request) {
	reason := r.URL.Query().Get("reason")
	if reason == "" {
		reason = "operator"
	}
	a.setDrain(w, r, reason)
}

// undrainReplica is DELETE /admin/replicas/{name}/drain.
func (a *Admin) undrainReplica(w http.ResponseWriter, r *http.Request) { a.setDrain(w, r, "") }

// setDrain drains the replica of r's path (reason != "") or undrains it.
func (a *Admin) setDrain(w http.ResponseWriter, r *http.Request, reason string) {
	name, ok := pathName(r, "name")
	if !ok {
		notFound(useDrain)(w, r)
		return
	}
	if err := a.s.DrainReplica(name, reason); err != nil {
		fail(w, http.StatusNotFound, "not_found", err.Error())
		return
	}
	writeJSON(w, map[string]any{"replica": name, "drained": reason != ""})
}

func (a *Admin) tenants(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, views.TenantStatuses(a.s.Tenants()))
}

// opContext bounds one admin operation's store calls. It is parented on the
// server's lifetime, not on the request's: a change the operator sent is
// carried through (and persisted) even if the client goes away mid-call.
func (a *Admin) opContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(a.base, d)
}
