package sim

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// requireKey answers 401 to a request for a /v1 path without
// "Authorization: Bearer <key>", as vLLM's AuthenticationMiddleware
// (vllm/entrypoints/openai/server_utils.py): OPTIONS and paths that do not
// start with /v1 (/health, /metrics, /tokenize, /detokenize, /pooling, …)
// pass; the scheme is matched without case; the body is
// {"error":"Unauthorized"}. An empty key requires nothing.
func requireKey(key string, next http.Handler) http.Handler {
	if key == "" {
		return next
	}
	want := sha256.Sum256([]byte(key))
	return http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		if hr.Method == http.MethodOptions || !strings.HasPrefix(hr.URL.Path, "/v1") {
			next.ServeHTTP(w, hr)
			return
		}
		scheme, param, _ := strings.Cut(hr.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(param))
		if !strings.EqualFold(scheme, "bearer") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			writeJSON(w, http.StatusUnauthorized, []byte(`{"error":"Unauthorized"}`))
			return
		}
		next.ServeHTTP(w, hr)
	})
}
