package scheduler

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
)

// ReservationLister is the optional ledger capability behind
// GET /admin/reservations (see [Admin.listReservations]).
type ReservationLister interface {
	List(ctx context.Context, tenant ledger.ScopeKey, state ledger.State, limit int) ([]ledger.ReservationInfo, error)
}

func (a *Admin) registerOps() {
	a.routes["GET /admin/budgets"] = a.listBudgets
	a.routes["PUT /admin/budgets"] = a.putBudget
	a.routes["DELETE /admin/budgets/"] = a.deleteBudget
	a.routes["GET /admin/tenants/"] = a.tenantUsage
	a.routes["POST /admin/tenants/"] = a.clamp
	a.routes["DELETE /admin/tenants/"] = a.unclamp
	a.routes["POST /admin/reservations/"] = a.resolve
	a.routes["GET /admin/reservations"] = a.listReservations
	a.routes["GET /admin/usage"] = a.usage
}

// inputError answers a bad admin request: 400 with the field path.
func (a *Admin) inputError(rc *fasthttp.RequestCtx, err error) {
	var ai *adminInputError
	switch {
	case errors.As(err, &ai):
		rc.SetStatusCode(http.StatusBadRequest)
		rc.SetContentType("application/json")
		b, _ := marshal(errorBody(&apiError{Code: "invalid_request", Type: "admin_error", Message: ai.Msg, Param: ai.Param}))
		rc.SetBody(b)
	case errors.Is(err, ErrNotFound), errors.Is(err, ledger.ErrNotFound):
		a.fail(rc, http.StatusNotFound, "not_found", oneLine(err))
	case errors.Is(err, ErrConfigBudget):
		a.fail(rc, http.StatusConflict, "config_budget", oneLine(err))
	case errors.Is(err, ledger.ErrAlreadyFinal):
		a.fail(rc, http.StatusConflict, "already_final", oneLine(err))
	case ledger.IsStoreError(err):
		a.fail(rc, http.StatusServiceUnavailable, "ledger_unavailable", oneLine(err))
	default:
		a.fail(rc, http.StatusInternalServerError, "admin_error", oneLine(err))
	}
}

// decode parses a JSON body strictly.
func decode(rc *fasthttp.RequestCtx, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(rc.PostBody())))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return inputErr("body", "%v", err)
	}
	return nil
}

func (a *Admin) listBudgets(rc *fasthttp.RequestCtx) {
	rows := a.s.Budgets(string(rc.QueryArgs().Peek("tenant")))
	ctx, cancel := a.opContext(2 * time.Second)
	defer cancel()
	a.budgetUsage(ctx, rows)
	WriteJSON(rc, rows)
}

func (a *Admin) putBudget(rc *fasthttp.RequestCtx) {
	var in struct {
		Tenant    string  `json:"tenant"`
		Dimension string  `json:"dimension"`
		Limit     *int64  `json:"limit"`
		Window    string  `json:"window"`
		Mode      string  `json:"mode"`
		WarnRatio float64 `json:"warn_ratio"`
	}
	if err := decode(rc, &in); err != nil {
		a.inputError(rc, err)
		return
	}
	if in.Tenant == "" {
		a.inputError(rc, inputErr("tenant", "required"))
		return
	}
	if in.Limit == nil {
		a.inputError(rc, inputErr("limit", "required"))
		return
	}
	w, err := time.ParseDuration(in.Window)
	if err != nil {
		a.inputError(rc, inputErr("window", "must be a duration such as 1h (got %q)", in.Window))
		return
	}
	b := config.Budget{Dimension: in.Dimension, Limit: *in.Limit, Window: w, Mode: in.Mode, WarnRatio: in.WarnRatio}
	row, err := a.s.SetBudget(in.Tenant, b)
	if err != nil {
		a.inputError(rc, err)
		return
	}
	WriteJSON(rc, row)
}

func (a *Admin) deleteBudget(rc *fasthttp.RequestCtx) {
	id := strings.TrimPrefix(string(rc.Path()), "/admin/budgets/")
	out, err := a.s.RemoveBudget(id)
	if err != nil {
		a.inputError(rc, err)
		return
	}
	WriteJSON(rc, out)
}

// tenantPath splits /admin/tenants/{name}/{what}.
func tenantPath(rc *fasthttp.RequestCtx) (name, what string) {
	rest := strings.TrimPrefix(string(rc.Path()), "/admin/tenants/")
	name, what, _ = strings.Cut(rest, "/")
	return name, what
}

// UsageRow is one limit of GET /admin/tenants/{name}/usage.
type UsageRow struct {
	Dimension string `json:"dimension"`
	Window    string `json:"window"`
	Limit     int64  `json:"limit"`
	Mode      string `json:"mode"`
	Committed int64  `json:"committed"`
	Reserved  int64  `json:"reserved"`
	Remaining int64  `json:"remaining"`
	ResetsAt  string `json:"resets_at,omitempty"`
}

func (a *Admin) tenantUsage(rc *fasthttp.RequestCtx) {
	name, what := tenantPath(rc)
	t := a.s.pol.Load().Tenants[name]
	if what != "usage" || t == nil {
		a.fail(rc, http.StatusNotFound, "not_found", "use /admin/tenants/{name}/usage with a configured tenant")
		return
	}
	ctx, cancel := a.opContext(2 * time.Second)
	defer cancel()
	u, err := a.s.led.Snapshot(ctx, t.ScopeKey, t.ScopeKey)
	if err != nil {
		a.inputError(rc, err)
		return
	}
	out := struct {
		Tenant     string           `json:"tenant"`
		Reserved   map[string]int64 `json:"reserved"`
		SlotsInUse int64            `json:"slots_in_use"`
		Unresolved int              `json:"unresolved"`
		Limits     []UsageRow       `json:"limits"`
		Clamp      *Clamp           `json:"clamp"`
	}{Tenant: name, Reserved: map[string]int64{}, SlotsInUse: u.SlotsInUse, Unresolved: u.Unresolved, Limits: []UsageRow{}}
	for d := range ledger.NumDims {
		if !d.Windowed() {
			continue
		}
		out.Reserved[d.String()] = u.Reserved[d]
	}
	// The limits in force (the policy's), not only those the ledger has
	// seen a request under: a tenant is listed before its first request,
	// and a reloaded limit shows at once.
	out.Limits = budgetRows(t.Limits, u)
	if c, ok := a.s.pol.Load().ClampOf(name, a.s.now()); ok {
		out.Clamp = &c
	}
	WriteJSON(rc, out)
}

func (a *Admin) clamp(rc *fasthttp.RequestCtx) {
	name, what := tenantPath(rc)
	if what != "clamp" {
		a.fail(rc, http.StatusNotFound, "not_found", "use /admin/tenants/{name}/clamp")
		return
	}
	var in struct {
		Concurrency     int      `json:"concurrency"`
		Weight          int      `json:"weight"`
		MaxOutputTokens int64    `json:"max_output_tokens"`
		Models          []string `json:"models"`
		Reason          string   `json:"reason"`
		ExpiresIn       string   `json:"expires_in"`
	}
	if err := decode(rc, &in); err != nil {
		a.inputError(rc, err)
		return
	}
	d, err := time.ParseDuration(in.ExpiresIn)
	if err != nil || d <= 0 {
		a.inputError(rc, inputErr("expires_in", "must be a positive duration such as 30m (got %q)", in.ExpiresIn))
		return
	}
	c, err := a.s.SetClamp(Clamp{Tenant: name, Concurrency: in.Concurrency, Weight: in.Weight, MaxOutputTokens: in.MaxOutputTokens,
		Models: in.Models, Reason: in.Reason, ExpiresAt: a.s.now().Add(d), Source: "admin"})
	if err != nil {
		a.inputError(rc, err)
		return
	}
	WriteJSON(rc, c)
}

func (a *Admin) unclamp(rc *fasthttp.RequestCtx) {
	name, what := tenantPath(rc)
	if what != "clamp" {
		a.fail(rc, http.StatusNotFound, "not_found", "use /admin/tenants/{name}/clamp")
		return
	}
	had, err := a.s.Unclamp(name)
	if err != nil {
		a.inputError(rc, err)
		return
	}
	if !had {
		a.fail(rc, http.StatusNotFound, "not_found", "tenant "+name+" has no clamp")
		return
	}
	WriteJSON(rc, map[string]any{"tenant": name, "unclamped": true})
}

// resolve handles POST /admin/reservations/{id}/resolve: charge an
// UNRESOLVED (or dispatched, abandoned) hold at its held amount, at given
// actual amounts, or at zero.
func (a *Admin) resolve(rc *fasthttp.RequestCtx) {
	rest := strings.TrimPrefix(string(rc.Path()), "/admin/reservations/")
	idHex, ok := strings.CutSuffix(rest, "/resolve")
	var id ledger.RequestID
	if b, err := hex.DecodeString(idHex); !ok || err != nil || len(b) != len(id) {
		a.inputError(rc, inputErr("id", "must be a 32-hex-digit ledger request id"))
		return
	}
	_, _ = hex.Decode(id[:], []byte(idHex))
	var in struct {
		Tenant string           `json:"tenant"`
		Charge string           `json:"charge"`
		Actual map[string]int64 `json:"actual"`
		Reason string           `json:"reason"`
	}
	if err := decode(rc, &in); err != nil {
		a.inputError(rc, err)
		return
	}
	t := a.s.pol.Load().Tenants[in.Tenant]
	switch {
	case t == nil:
		a.inputError(rc, inputErr("tenant", "unknown tenant %q", in.Tenant))
		return
	case in.Reason == "":
		a.inputError(rc, inputErr("reason", "required"))
		return
	}
	ref := ledger.Ref{Tenant: t.ScopeKey, ID: id}
	ctx, cancel := a.opContext(5 * time.Second)
	defer cancel()
	var st ledger.Settlement
	var err error
	switch in.Charge {
	case "held":
		st, err = a.s.led.Resolve(ctx, ref)
	case "zero", "actual":
		var amt ledger.Amounts
		for k, v := range in.Actual {
			if in.Charge == "zero" {
				break
			}
			d, perr := ledger.ParseDim(k)
			if perr != nil || d == ledger.Slots {
				a.inputError(rc, inputErr("actual."+k, "unknown dimension"))
				return
			}
			amt[d] = v
		}
		if in.Charge == "actual" && amt[ledger.Tokens] == 0 {
			amt[ledger.Tokens] = amt[ledger.InputTokens] + amt[ledger.OutputTokens]
		}
		if verr := amt.Validate(); verr != nil {
			a.inputError(rc, inputErr("actual", "%v", verr))
			return
		}
		st, err = a.s.led.Settle(ctx, ref, amt, ledger.SourceResolved)
	default:
		a.inputError(rc, inputErr("charge", "must be held, actual or zero (got %q)", in.Charge))
		return
	}
	if err != nil {
		a.inputError(rc, err)
		return
	}
	a.s.log.Warn("reservation resolved by admin", "tenant", in.Tenant, "id", idHex, "charge", in.Charge, "reason", in.Reason)
	a.s.record(audit.Record{Kind: audit.KindResolve, Tenant: in.Tenant, RequestID: idHex, Source: "operator", State: st.State.String(),
		Reason: in.Charge + ": " + in.Reason, TokensCharged: st.Charged[ledger.Tokens], GPUMs: st.Charged[ledger.GPUMs], USDMicros: st.Charged[ledger.USDMicros]})
	charged := map[string]int64{}
	for d := range ledger.NumDims {
		if !d.Windowed() {
			continue
		}
		charged[d.String()] = st.Charged[d]
	}
	WriteJSON(rc, map[string]any{"id": idHex, "state": st.State.String(), "charged": charged})
}

func (a *Admin) listReservations(rc *fasthttp.RequestCtx) {
	lister, ok := a.s.led.(ReservationLister)
	if !ok {
		a.fail(rc, http.StatusNotImplemented, "not_supported",
			"this ledger backend cannot list reservations yet; resolve by the id in the audit trail or logs")
		return
	}
	var state ledger.State
	switch string(rc.QueryArgs().Peek("state")) {
	case "", "unresolved":
		state = ledger.Unresolved
	case "dispatched":
		state = ledger.Dispatched
	case "reserved":
		state = ledger.Reserved
	default:
		a.inputError(rc, inputErr("state", "must be unresolved, dispatched or reserved"))
		return
	}
	type row struct {
		ID          string           `json:"id"`
		Tenant      string           `json:"tenant"`
		State       string           `json:"state"`
		Held        map[string]int64 `json:"held"`
		LeaseExpiry string           `json:"lease_expiry"`
		AdmittedAt  string           `json:"admitted_at"`
	}
	out := []row{}
	for _, t := range a.s.pol.Load().Order {
		if want := string(rc.QueryArgs().Peek("tenant")); want != "" && want != t.Name {
			continue
		}
		ctx, cancel := a.opContext(2 * time.Second)
		refs, err := lister.List(ctx, t.ScopeKey, state, 1000)
		cancel()
		if err != nil {
			a.inputError(rc, err)
			return
		}
		for _, r := range refs {
			held := map[string]int64{}
			for d := range ledger.NumDims {
				if !d.Windowed() {
					continue
				}
				if r.Held[d] != 0 {
					held[d.String()] = r.Held[d]
				}
			}
			out = append(out, row{ID: r.Ref.ID.String(), Tenant: t.Name, State: r.State.String(), Held: held,
				LeaseExpiry: r.LeaseExpiry.UTC().Format(time.RFC3339), AdmittedAt: r.AdmittedAt.UTC().Format(time.RFC3339)})
		}
	}
	WriteJSON(rc, out)
}
