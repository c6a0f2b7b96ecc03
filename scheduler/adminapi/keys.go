package scheduler

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// registerKeys adds the run-time key endpoints:
//
//	POST   /admin/keys        create; answers the key once
//	GET    /admin/keys        list (?tenant=); never a secret
//	DELETE /admin/keys/{id}   revoke
func (a *Admin) registerKeys() {
	a.routes["POST /admin/keys"] = a.createKey
	a.routes["GET /admin/keys"] = a.listKeys
	a.routes["DELETE /admin/keys/"] = a.revokeKey
}

func (a *Admin) createKey(rc *fasthttp.RequestCtx) {
	var in KeyRequest
	if err := decode(rc, &in); err != nil {
		a.inputError(rc, err)
		return
	}
	if in.Tenant == "" {
		a.inputError(rc, inputErr("tenant", "required"))
		return
	}
	ctx, cancel := a.opContext(5 * time.Second)
	defer cancel()
	k, err := a.s.CreateKey(ctx, in)
	if err != nil {
		a.keyError(rc, err)
		return
	}
	// 200 like every admin write; no-store: this is the only copy of the key.
	rc.Response.Header.Set("Cache-Control", "no-store")
	WriteJSON(rc, k)
}

func (a *Admin) listKeys(rc *fasthttp.RequestCtx) {
	WriteJSON(rc, a.s.ListKeys(string(rc.QueryArgs().Peek("tenant"))))
}

func (a *Admin) revokeKey(rc *fasthttp.RequestCtx) {
	id := strings.TrimPrefix(string(rc.Path()), "/admin/keys/")
	if id == "" || strings.Contains(id, "/") {
		a.fail(rc, http.StatusNotFound, "not_found", "use DELETE /admin/keys/{id}")
		return
	}
	ctx, cancel := a.opContext(5 * time.Second)
	defer cancel()
	row, err := a.s.RevokeKey(ctx, id)
	if err != nil {
		a.keyError(rc, err)
		return
	}
	WriteJSON(rc, map[string]any{"revoked": row})
}

func (a *Admin) keyError(rc *fasthttp.RequestCtx, err error) {
	if errors.Is(err, ErrKeyStore) {
		a.fail(rc, http.StatusServiceUnavailable, "key_store_unavailable", oneLine(err))
		return
	}
	a.inputError(rc, err)
}
