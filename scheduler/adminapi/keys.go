package adminapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/scheduler"
)

// The run-time key endpoints:
//
//	POST   /admin/keys        create; answers the key once
//	GET    /admin/keys        list (?tenant=); never a secret
//	DELETE /admin/keys/{id}   revoke

func (a *Admin) createKey(w http.ResponseWriter, r *http.Request) {
	var in scheduler.KeyRequest
	if !readInput(w, r, &in, func() error { return required("tenant", in.Tenant) }) {
		return
	}
	ctx, cancel := a.opContext(5 * time.Second)
	defer cancel()
	k, err := a.s.CreateKey(ctx, in)
	if err != nil {
		keyError(w, err)
		return
	}
	// 200 like every admin write; no-store: this is the only copy of the key.
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, k)
}

func (a *Admin) listKeys(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, a.s.ListKeys(r.URL.Query().Get("tenant")))
}

func (a *Admin) revokeKey(w http.ResponseWriter, r *http.Request) {
	id, ok := pathName(r, "id")
	if !ok {
		notFound(useRevoke)(w, r)
		return
	}
	ctx, cancel := a.opContext(5 * time.Second)
	defer cancel()
	row, err := a.s.RevokeKey(ctx, id)
	if err != nil {
		keyError(w, err)
		return
	}
	writeJSON(w, map[string]any{"revoked": row})
}

func keyError(w http.ResponseWriter, err error) {
	if errors.Is(err, scheduler.ErrKeyStore) {
		fail(w, http.StatusServiceUnavailable, "key_store_unavailable", oneLine(err))
		return
	}
	inputError(w, err)
}
