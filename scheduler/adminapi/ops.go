package adminapi

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/views"
)

// maxBody bounds an admin request body, as the admin listener always has.
const maxBody = 4 << 20

// inputError answers a bad admin request: 400 with the field path.
func inputError(w http.ResponseWriter, err error) {
	if param, msg, ok := scheduler.AdminInputField(err); ok {
		failParam(w, http.StatusBadRequest, "invalid_request", msg, param)
		return
	}
	switch {
	case errors.Is(err, apierr.ErrNotFound), errors.Is(err, ledger.ErrNotFound):
		fail(w, http.StatusNotFound, "not_found", oneLine(err))
	case errors.Is(err, scheduler.ErrConfigBudget):
		fail(w, http.StatusConflict, "config_budget", oneLine(err))
	case errors.Is(err, ledger.ErrAlreadyFinal):
		fail(w, http.StatusConflict, "already_final", oneLine(err))
	case ledger.IsStoreError(err):
		fail(w, http.StatusServiceUnavailable, "ledger_unavailable", oneLine(err))
	default:
		fail(w, http.StatusInternalServerError, "admin_error", oneLine(err))
	}
}

var inputErr = scheduler.AdminInputError

// required is the error of a required field left empty.
func required(param, v string) error {
	if v == "" {
		return inputErr(param, "required")
	}
	return nil
}

// readInput decodes r's JSON body into in and checks it (check may read
// in and set the handler's other locals). On a bad body or a failed
// check it answers 400 naming the field, and reports false.
func readInput(w http.ResponseWriter, r *http.Request, in any, check func() error) bool {
	err := decode(r, in)
	if err == nil {
		err = check()
	}
	if err != nil {
		inputError(w, err)
		return false
	}
	return true
}

// decode parses a JSON body strictly.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err == nil && len(body) > maxBody {
		err = errors.New("request body too large")
	}
	if err != nil {
		return inputErr("body", "%v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return inputErr("body", "%v", err)
	}
	return nil
}

func (a *Admin) listBudgets(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := a.opContext(2 * time.Second)
	defer cancel()
	rows := a.s.Budgets(r.URL.Query().Get("tenant"))
	tenants := make([]string, 0, len(rows))
	for _, row := range rows {
		tenants = append(tenants, row.Tenant)
	}
	// Each row's use in its current window, from one ledger snapshot per
	// tenant; a tenant whose snapshot fails keeps its rows without use and
	// names the error.
	use := a.s.LedgerUse(ctx, tenants)
	for i := range rows {
		row := &rows[i]
		u, ok := use[row.Tenant]
		if ok && u.Err != nil {
			row.UsageError = oneLine(u.Err)
			continue
		}
		if iu, known := views.BudgetInUse(row.Dimension, row.Window, row.Limit, u.Usage); ok && known {
			row.Committed, row.Reserved, row.Remaining, row.ResetsAt = &iu.Committed, &iu.Reserved, &iu.Remaining, iu.ResetsAt
		}
	}
	writeJSON(w, rows)
}

func (a *Admin) putBudget(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Tenant    string  `json:"tenant"`
		Dimension string  `json:"dimension"`
		Limit     *int64  `json:"limit"`
		Window    string  `json:"window"`
		Mode      string  `json:"mode"`
		WarnRatio float64 `json:"warn_ratio"`
	}
	var b config.Budget
	if !readInput(w, r, &in, func() error {
		win, err := time.ParseDuration(in.Window)
		switch {
		case in.Tenant == "":
			return inputErr("tenant", "required")
		case in.Limit == nil:
			return inputErr("limit", "required")
		case err != nil:
			return inputErr("window", "must be a duration such as 1h (got %q)", in.Window)
		}
		b = config.Budget{Dimension: in.Dimension, Limit: *in.Limit, Window: win, Mode: in.Mode, WarnRatio: in.WarnRatio}
		return nil
	}) {
		return
	}
	row, err := a.s.SetBudget(in.Tenant, b)
	if err != nil {
		inputError(w, err)
		return
	}
	writeJSON(w, row)
}

func (a *Admin) deleteBudget(w http.ResponseWriter, r *http.Request) {
	out, err := a.s.RemoveBudget(r.PathValue("id"))
	if err != nil {
		inputError(w, err)
		return
	}
	writeJSON(w, out)
}

func (a *Admin) tenantUsage(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(r, "name")
	if !ok || !a.s.HasTenant(name) {
		notFound(useUsage)(w, r)
		return
	}
	ctx, cancel := a.opContext(2 * time.Second)
	defer cancel()
	use := a.s.LedgerUse(ctx, []string{name})[name]
	if use.Err != nil {
		inputError(w, use.Err)
		return
	}
	for _, t := range a.s.Tenants() {
		if t.Name == name {
			t.Use = use
			writeJSON(w, views.TenantUsageOf(t))
			return
		}
	}
	inputError(w, apierr.ErrNotFound) // a reload removed it after HasTenant
}

func (a *Admin) clamp(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(r, "name")
	if !ok {
		notFound(useClamp)(w, r)
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
	var d time.Duration
	if !readInput(w, r, &in, func() (err error) {
		if d, err = time.ParseDuration(in.ExpiresIn); err != nil || d <= 0 {
			return inputErr("expires_in", "must be a positive duration such as 30m (got %q)", in.ExpiresIn)
		}
		return nil
	}) {
		return
	}
	c, err := a.s.SetClamp(scheduler.Clamp{Tenant: name, Concurrency: in.Concurrency, Weight: in.Weight, MaxOutputTokens: in.MaxOutputTokens,
		Models: in.Models, Reason: in.Reason, ExpiresAt: a.s.Now().Add(d), Source: "admin"})
	if err != nil {
		inputError(w, err)
		return
	}
	writeJSON(w, c)
}

func (a *Admin) unclamp(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(r, "name")
	if !ok {
		notFound(useClamp)(w, r)
		return
	}
	had, err := a.s.Unclamp(name)
	if err != nil {
		inputError(w, err)
		return
	}
	if !had {
		fail(w, http.StatusNotFound, "not_found", "tenant "+name+" has no clamp")
		return
	}
	writeJSON(w, map[string]any{"tenant": name, "unclamped": true})
}

// resolve handles POST /admin/reservations/{id}/resolve: charge an
// UNRESOLVED (or dispatched, abandoned) hold at its held amount, at given
// actual amounts, or at zero.
func (a *Admin) resolve(w http.ResponseWriter, r *http.Request) {
	idHex := r.PathValue("id")
	if b, err := hex.DecodeString(idHex); err != nil || len(b) != len(ledger.RequestID{}) {
		badReservationID(w, r)
		return
	}
	var in struct {
		Tenant string           `json:"tenant"`
		Charge string           `json:"charge"`
		Actual map[string]int64 `json:"actual"`
		Reason string           `json:"reason"`
	}
	var res scheduler.Resolution
	if !readInput(w, r, &in, func() error {
		res = scheduler.Resolution{Tenant: in.Tenant, ID: idHex, Charge: in.Charge, Reason: in.Reason}
		return a.checkResolution(&res, in.Actual)
	}) {
		return
	}
	ctx, cancel := a.opContext(5 * time.Second)
	defer cancel()
	st, err := a.s.ResolveReservation(ctx, res)
	if err != nil {
		inputError(w, err)
		return
	}
	writeJSON(w, map[string]any{"id": idHex, "state": st.State.String(), "charged": views.Windowed(st.Charged, true)})
}

func badReservationID(w http.ResponseWriter, _ *http.Request) {
	inputError(w, inputErr("id", "must be a 32-hex-digit ledger request id"))
}

// checkResolution checks a resolution's fields in the order the API
// reports them (tenant, reason, charge, actual) and sets its amounts from
// actual, by dimension name: tokens default to input + output.
func (a *Admin) checkResolution(res *scheduler.Resolution, actual map[string]int64) error {
	switch {
	case !a.s.HasTenant(res.Tenant):
		return inputErr("tenant", "unknown tenant %q", res.Tenant)
	case res.Reason == "":
		return inputErr("reason", "required")
	}
	switch res.Charge {
	case "held", "zero":
		return nil
	case "actual":
	default:
		return inputErr("charge", "must be held, actual or zero (got %q)", res.Charge)
	}
	amt := &res.Amounts
	for k, v := range actual {
		d, err := ledger.ParseDim(k)
		if err != nil || d == ledger.Slots {
			return inputErr("actual."+k, "unknown dimension")
		}
		amt[d] = v
	}
	if amt[ledger.Tokens] == 0 {
		amt[ledger.Tokens] = amt[ledger.InputTokens] + amt[ledger.OutputTokens]
	}
	if err := amt.Validate(); err != nil {
		return inputErr("actual", "%v", err)
	}
	return nil
}

func (a *Admin) listReservations(w http.ResponseWriter, r *http.Request) {
	const unsupported = "this ledger backend cannot list reservations yet; resolve by the id in the audit trail or logs"
	if !a.s.ListsReservations() {
		fail(w, http.StatusNotImplemented, "not_supported", unsupported)
		return
	}
	var state ledger.State
	q := r.URL.Query()
	switch q.Get("state") {
	case "", "unresolved":
		state = ledger.Unresolved
	case "dispatched":
		state = ledger.Dispatched
	case "reserved":
		state = ledger.Reserved
	default:
		inputError(w, inputErr("state", "must be unresolved, dispatched or reserved"))
		return
	}
	// Each tenant's read is bounded by the server (2 s), not the whole list.
	out, err := a.s.Reservations(a.base, q.Get("tenant"), state)
	switch {
	case errors.Is(err, scheduler.ErrNotSupported):
		fail(w, http.StatusNotImplemented, "not_supported", unsupported)
	case err != nil:
		inputError(w, err)
	default:
		writeJSON(w, views.Reservations(out))
	}
}
