package vllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testKey = "sk-upstream-0123456789"

// TestSecretNeverPrints: no fmt verb, slog handler or encoder shows the
// key, also inside structs (an unexported field cannot call its methods).
func TestSecretNeverPrints(t *testing.T) {
	t.Parallel()
	s := NewSecret(testKey)
	type holder struct {
		Key    Secret
		hidden Secret
	}
	h := holder{Key: s, hidden: s}
	var out []string
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		out = append(out, fmt.Sprintf(f, s), fmt.Sprintf(f, h), fmt.Sprintf(f, &h))
	}
	out = append(out, fmt.Sprint(s), fmt.Sprintln(h), s.String())
	j, err := json.Marshal(h)
	require.NoError(t, err)
	out = append(out, string(j))
	var lb bytes.Buffer
	for _, hd := range []slog.Handler{slog.NewJSONHandler(&lb, nil), slog.NewTextHandler(&lb, nil)} {
		slog.New(hd).Info("x", "key", s, "holder", h, "any", any(s))
	}
	out = append(out, lb.String())
	for _, o := range out {
		assert.NotContains(t, o, testKey)
		assert.NotContains(t, o, fmt.Sprintf("%x", testKey))
	}
	assert.Equal(t, "[redacted]", s.String())
	assert.Equal(t, testKey, s.Reveal())
	assert.True(t, s.Set())
	assert.False(t, NewSecret("").Set())
	assert.Equal(t, "", NewSecret("").String())
}

// authRecorder answers every path and records the Authorization header
// each request carried.
type authRecorder struct {
	mu   sync.Mutex
	seen map[string]string // path → Authorization
}

func (a *authRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	a.mu.Lock()
	a.seen[r.URL.Path] = r.Header.Get("Authorization")
	a.mu.Unlock()
	switch r.URL.Path {
	case "/v1/chat/completions":
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	case "/v1/models":
		writeTestJSON(w, `{"data":[{"id":"m","max_model_len":100}]}`)
	case "/tokenize":
		writeTestJSON(w, `{"count":3,"max_model_len":100}`)
	case "/redirect":
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	default:
		writeTestJSON(w, `{}`)
	}
}

func writeTestJSON(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, s)
}

func (a *authRecorder) get(path string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.seen[path]
	return v, ok
}

// TestCredentialsOnEveryUpstreamCall: a keyed replica gets
// "Authorization: Bearer <key>" on generation, /v1/models, /tokenize,
// /metrics, /health and the other endpoints; another replica gets none,
// nor does a host a keyed replica redirects to.
func TestCredentialsOnEveryUpstreamCall(t *testing.T) {
	t.Parallel()
	keyed := &authRecorder{seen: map[string]string{}}
	open := &authRecorder{seen: map[string]string{}}
	ks, os := httptest.NewServer(keyed), httptest.NewServer(open)
	defer ks.Close()
	defer os.Close()
	c := NewClient(Config{})
	require.NoError(t, c.SetCredentials(map[string]Secret{ks.URL + "/": NewSecret(testKey), os.URL: {}}))

	for _, base := range []string{ks.URL, os.URL} {
		s, err := c.Stream(t.Context(), base, "/v1/chat/completions", []byte(`{"stream":true}`), "id-1")
		require.NoError(t, err)
		s.Close()
		_, err = c.Models(t.Context(), base)
		require.NoError(t, err)
		r := mustParse(t, EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		_, _, err = c.Tokenize(t.Context(), base, "m", r)
		require.NoError(t, err)
		_, _, err = c.get(t.Context(), base+"/metrics")
		require.NoError(t, err)
		_, _, err = c.get(t.Context(), base+"/health")
		require.NoError(t, err)
		resp, err := c.Post(t.Context(), base, "/v1/embeddings", []byte(`{}`), "id-2")
		require.NoError(t, err)
		_, _ = c.ReadBody(resp)
	}
	for _, p := range []string{"/v1/chat/completions", "/v1/models", "/tokenize", "/metrics", "/health", "/v1/embeddings"} {
		got, ok := keyed.get(p)
		assert.True(t, ok, p)
		assert.Equal(t, "Bearer "+testKey, got, p)
		got, ok = open.get(p)
		assert.True(t, ok, p)
		assert.Empty(t, got, p)
	}

	// A redirect to another host does not carry the key.
	_, _, err := c.get(t.Context(), ks.URL+"/redirect?to="+os.URL+"/landed")
	require.NoError(t, err)
	got, ok := open.get("/landed")
	assert.True(t, ok)
	assert.Empty(t, got)

	// Replacing the set rotates the key; an empty set removes it.
	require.NoError(t, c.SetCredentials(map[string]Secret{ks.URL: NewSecret("rotated")}))
	_, _, err = c.get(t.Context(), ks.URL+"/metrics")
	require.NoError(t, err)
	got, _ = keyed.get("/metrics")
	assert.Equal(t, "Bearer rotated", got)
	require.NoError(t, c.SetCredentials(nil))
	s, err := c.Stream(t.Context(), ks.URL, "/v1/chat/completions", []byte(`{"stream":true}`), "")
	require.NoError(t, err)
	s.Close()
	got, _ = keyed.get("/v1/chat/completions")
	assert.Empty(t, got)
}

// TestSetCredentialsRefusesBadKeys: a key that would split the header is
// refused, and the error does not show it.
func TestSetCredentialsRefusesBadKeys(t *testing.T) {
	t.Parallel()
	c := NewClient(Config{})
	err := c.SetCredentials(map[string]Secret{"http://127.0.0.1:1": NewSecret("abc\r\nX-Evil: 1")})
	require.Error(t, err)
	assert.False(t, strings.Contains(err.Error(), "X-Evil"))
}
