package scheduler

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/vllm"
)

// AdminHooks are the process-level actions the admin API can trigger.
type AdminHooks struct {
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
	s       *Server
	base    context.Context // parent of every operation's context (opContext)
	token   []byte
	hooks   AdminHooks
	metrics fasthttp.RequestHandler
	routes  map[string]fasthttp.RequestHandler
	// gatherer feeds the status page the counters /metrics serves.
	gatherer prometheus.Gatherer
	// sessionKey signs status page sessions (status.go); random per
	// process, so a restart ends them.
	sessionKey [32]byte
}

// NewAdmin builds the admin handler. base is the parent of every operation's
// context (the server's lifetime, as the edge's).
func NewAdmin(base context.Context, s *Server, token string, g prometheus.Gatherer, hooks AdminHooks) *Admin {
	a := &Admin{s: s, base: base, token: []byte(token), hooks: hooks, gatherer: g,
		metrics: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(g, promhttp.HandlerOpts{}))}
	a.routes = map[string]fasthttp.RequestHandler{
		"POST /admin/drain":   a.drain,
		"POST /admin/reload":  a.reload,
		"GET /admin/replicas": a.replicas,
		"GET /admin/tenants":  a.tenants,
		// POST /admin/replicas/{name}/drain?reason=… drains a replica (it
		// finishes what it runs and gets nothing new); DELETE undrains.
		"POST /admin/replicas/":   a.drainReplica,
		"DELETE /admin/replicas/": a.drainReplica,
	}
	if _, err := rand.Read(a.sessionKey[:]); err != nil {
		panic("crypto/rand: " + err.Error()) // never fails on supported platforms
	}
	a.registerOps()
	a.registerKeys()
	return a
}

// HTTPServer returns the admin listener's fasthttp.Server.
func (a *Admin) HTTPServer() *fasthttp.Server {
	return &fasthttp.Server{Handler: a.Handle, Name: "sluice-admin", ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
}

// Handle routes admin-listener requests.
func (a *Admin) Handle(rc *fasthttp.RequestCtx) {
	path := string(rc.Path())
	switch path {
	case "/metrics":
		a.metrics(rc)
		return
	case "/healthz":
		rc.SetBodyString("ok\n")
		return
	case "/readyz":
		ok, why := a.s.Ready()
		if !ok {
			rc.SetStatusCode(503)
		} else if d := a.s.ReadyDetail(); d != "" {
			why += "\n" + d
		}
		rc.SetBodyString(why + "\n")
		return
	case "/status", "/status.json", "/status/report.json", "/status/login":
		a.status(rc)
		return
	case "/":
		// The listener's root is where an operator's browser lands first.
		rc.Redirect("/status", http.StatusFound)
		return
	}
	if !strings.HasPrefix(path, "/admin/") {
		a.fail(rc, http.StatusNotFound, "not_found", "no such endpoint")
		return
	}
	if len(a.token) == 0 {
		a.fail(rc, http.StatusForbidden, "admin_disabled", "the admin API is disabled: set SLUICE_ADMIN_TOKEN")
		return
	}
	got, ok := strings.CutPrefix(string(rc.Request.Header.Peek("Authorization")), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), a.token) != 1 {
		a.fail(rc, http.StatusUnauthorized, "invalid_admin_token", "missing or wrong admin token")
		return
	}
	h, found := a.routes[string(rc.Method())+" "+path]
	if !found {
		h = a.prefixRoute(string(rc.Method()), path)
	}
	if h == nil {
		a.fail(rc, http.StatusNotFound, "not_found", "no such admin endpoint")
		return
	}
	h(rc)
}

// prefixRoute finds a route registered as "METHOD /admin/x/" for paths
// with an id below it.
func (a *Admin) prefixRoute(method, path string) fasthttp.RequestHandler {
	var best string
	for p := range a.routes {
		m, rest, _ := strings.Cut(p, " ")
		if m == method && strings.HasSuffix(rest, "/") && strings.HasPrefix(path, rest) && len(rest) > len(best) {
			best = rest
		}
	}
	if best == "" {
		return nil
	}
	return a.routes[method+" "+best]
}

func (a *Admin) fail(rc *fasthttp.RequestCtx, status int, code, msg string) {
	a.s.adminError(rc, status, code, msg)
}

// adminError writes an admin error in the pinned shape.
func (s *Server) adminError(rc *fasthttp.RequestCtx, status int, code, msg string) {
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	b, _ := marshal(errorBody(&apiError{Status: status, Code: code, Type: "admin_error", Message: msg}))
	rc.SetBody(b)
}

// WriteJSON writes v as a 200 JSON response.
func WriteJSON(rc *fasthttp.RequestCtx, v any) {
	b, err := marshal(v)
	if err != nil {
		rc.SetStatusCode(500)
		return
	}
	rc.SetContentType("application/json")
	rc.SetBody(append(b, '\n'))
}

func (a *Admin) drain(rc *fasthttp.RequestCtx) {
	a.s.StartDrain()
	if a.hooks.Drain != nil {
		a.hooks.Drain()
	}
	WriteJSON(rc, map[string]string{"status": "draining"})
}

func (a *Admin) reload(rc *fasthttp.RequestCtx) {
	if a.hooks.Reload == nil {
		a.fail(rc, http.StatusNotImplemented, "not_supported", "reload is not wired")
		return
	}
	if err := a.hooks.Reload(); err != nil {
		a.fail(rc, http.StatusBadRequest, "invalid_config", oneLine(err))
		return
	}
	// restart_needed: restart-only fields (listen, ledger, replicas, ...)
	// the file changes; they keep their start-up value until a restart.
	WriteJSON(rc, map[string]any{"status": "reloaded", "version": a.s.pol.Load().Version, "restart_needed": a.s.RestartNeeded()})
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// ReplicaStatus is one row of GET /admin/replicas.
type ReplicaStatus struct {
	Name           string  `json:"name"`
	URL            string  `json:"url"`
	State          string  `json:"state"`
	Reason         string  `json:"reason,omitempty"`
	CapacityTokens int64   `json:"capacity_tokens"`
	InflightTokens int64   `json:"inflight_tokens"`
	Inflight       int64   `json:"inflight_requests"`
	Overcommit     float64 `json:"overcommit"`
	Running        int64   `json:"vllm_running"`
	Waiting        int64   `json:"vllm_waiting"`
	// AbortsHeld: a scrape showed sequences this instance cannot account
	// for (another instance's, or aborts the replica ignored), so aborted
	// requests keep their slot there until a scrape (SCHEDULING §7).
	AbortsHeld bool `json:"aborts_held"`
	// Peers is how many other instances report demand on this replica (a
	// Redis fleet); SeqShare is this instance's cap on its requests here
	// while they do, its fair share of max_num_seqs (0: none; SCHEDULING §9).
	Peers    int64 `json:"peers"`
	SeqShare int64 `json:"seq_share"`
	// Sizing is where capacity_tokens comes from: "kv" (the replica's
	// vllm:cache_config_info), "batch" (its metrics lack that: it is sized
	// on max_num_seqs and capacity_tokens is only a bound), "config"
	// (capacity_tokens in the config), or "" before the first scrape.
	Sizing string `json:"sizing"`
	// WaitingDeferred is the part of vllm_waiting held back by a
	// transient constraint (LoRA budget, KV transfer, grammar), not room.
	WaitingDeferred int64 `json:"vllm_waiting_deferred"`
	// LoRAResident is the LoRA adapters of the replica's running requests
	// (vllm:lora_requests_info); requests for them prefer this replica.
	LoRAResident []string `json:"lora_resident,omitempty"`
	// MaxNumSeqs is the configured bound (default 256); LearnedBatch is
	// the batch learned from the replica's scrapes, which Sluice fills
	// instead while it is set (0: none learned; SCHEDULING §7).
	MaxNumSeqs   int64 `json:"max_num_seqs"`
	LearnedBatch int64 `json:"learned_batch"`
}

// fillReplica adds what the monitor and the last scrape know of r.
func fillReplica(st *ReplicaStatus, r *replica, v gpu.ReplicaView, known bool) {
	if known {
		st.State, st.Reason, st.CapacityTokens, st.Overcommit, st.Sizing = v.State.String(), v.Reason, v.CapacityTokens, v.Overcommit, v.Sizing
	}
	if o := r.obs.Load(); o != nil {
		st.Running, st.Waiting, st.WaitingDeferred, st.LoRAResident = o.running, o.waiting, o.deferred, o.loras
	}
}

func (a *Admin) replicas(rc *fasthttp.RequestCtx) {
	snap := a.s.gpu.Snapshot()
	now := a.s.now()
	out := []ReplicaStatus{}
	for _, r := range a.s.reps.list() {
		st := ReplicaStatus{Name: r.name, URL: vllm.RedactURL(r.url), InflightTokens: r.load.Load(), Inflight: r.count.Load(), State: "unknown",
			AbortsHeld: r.distrusted(now), Peers: r.peers.Load(), SeqShare: r.share.Load(),
			MaxNumSeqs: r.maxSeqs, LearnedBatch: r.batch.learned.Load()}
		v, ok := snap.Replica(r.name)
		fillReplica(&st, r, v, ok)
		out = append(out, st)
	}
	WriteJSON(rc, out)
}

func (a *Admin) drainReplica(rc *fasthttp.RequestCtx) {
	rest := strings.TrimPrefix(string(rc.Path()), "/admin/replicas/")
	name, ok := strings.CutSuffix(rest, "/drain")
	if !ok || name == "" || strings.Contains(name, "/") {
		a.fail(rc, http.StatusNotFound, "not_found", "use /admin/replicas/{name}/drain")
		return
	}
	reason := ""
	if rc.IsPost() {
		reason = string(rc.QueryArgs().Peek("reason"))
		if reason == "" {
			reason = "operator"
		}
	}
	if err := a.s.gpu.Drain(name, reason); err != nil {
		a.fail(rc, http.StatusNotFound, "not_found", err.Error())
		return
	}
	a.s.log.Info("replica drain changed by admin", "replica", name, "drained", reason != "", "reason", reason)
	a.s.signal(a.s.wake)
	WriteJSON(rc, map[string]any{"replica": name, "drained": reason != ""})
}

// TenantStatus is one row of GET /admin/tenants.
type TenantStatus struct {
	Name        string `json:"name"`
	Weight      int    `json:"weight"`
	Priority    int    `json:"priority"`
	Concurrency int    `json:"concurrency"`
	Inflight    int64  `json:"inflight_requests"`
	Queued      int    `json:"queued"`
	Charged     int64  `json:"charged_cost"`
	Clamp       *Clamp `json:"clamp"`
}

func (a *Admin) tenants(rc *fasthttp.RequestCtx) {
	out := []TenantStatus{}
	for _, t := range a.s.pol.Load().Order {
		ts := TenantStatus{Name: t.Name, Weight: t.Cfg.Weight, Priority: t.Cfg.Priority, Concurrency: t.Cfg.Concurrency, Inflight: t.RT.Inflight.Load()}
		if qs, ok := a.s.q.Stats(t.Name); ok {
			ts.Queued, ts.Charged = qs.Depth, qs.Charged
		}
		if c, ok := a.s.pol.Load().ClampOf(t.Name, a.s.now()); ok {
			ts.Clamp = &c
		}
		out = append(out, ts)
	}
	WriteJSON(rc, out)
}

// opContext bounds one admin operation's store calls. It is parented on the
// server's lifetime, never on the *fasthttp.RequestCtx: fasthttp recycles
// that once the handler returns, and a context.WithTimeout child of it leaves
// a goroutine that may still read its user values on server shutdown (a data
// race the race detector caught in TestKeyCLIAgainstServer).
func (a *Admin) opContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(a.base, d)
}
