package node

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// bodyTap records the generation bodies a replica receives.
type bodyTap struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (b *bodyTap) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			raw, _ := io.ReadAll(r.Body)
			var m map[string]any
			_ = json.Unmarshal(raw, &m)
			b.mu.Lock()
			b.bodies = append(b.bodies, m)
			b.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(raw))
		}
		next.ServeHTTP(w, r)
	})
}

func (b *bodyTap) last() map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bodies[len(b.bodies)-1]
}

func cachedTokens(t *testing.T, body []byte) float64 {
	t.Helper()
	var out struct {
		Usage struct {
			Details struct {
				Cached float64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(body, &out), string(body))
	return out.Usage.Details.Cached
}

// A tenant with cache_isolation: salt gets a prefix-cache namespace of its
// own: the same prompt another tenant cached is a miss for it (no timing
// side channel), its own repeats hit, and a cache_salt its client sends
// is replaced, so it cannot join another namespace either.
func TestCacheIsolationSalt(t *testing.T) {
	t.Parallel()
	cfg := sim.DefaultConfig()
	cfg.EnablePromptTokensDetails = true
	tap := &bodyTap{}
	rep := startSimWrapped(t, cfg, tap.wrap)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    cache_isolation: salt\n", ""))
	prompt := strings.Repeat("the same long shared system prompt ", 40)
	chat := func(key, extra string) []byte {
		r := n.call(t, "/v1/chat/completions", key, `{"model":"sim-model","max_tokens":4,`+extra+`"messages":[{"role":"user","content":"`+prompt+`"}]}`)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
		return r.Body
	}
	chat(keyBeta, "")
	assert.Positive(t, cachedTokens(t, chat(keyBeta, "")), "beta's repeat hits the shared cache")
	assert.Zero(t, cachedTokens(t, chat(keyAcme, "")), "acme misses what beta cached")
	salt, _ := tap.last()["cache_salt"].(string)
	assert.Len(t, salt, 43, "a 256-bit salt")
	assert.NotContains(t, salt, "acme", "a keyed hash, never the tenant's name")
	assert.Positive(t, cachedTokens(t, chat(keyAcme, "")), "acme's own repeat hits")

	chat(keyAcme, `"cache_salt":"shared-guess",`)
	assert.Equal(t, salt, tap.last()["cache_salt"], "the client's salt is replaced")
	assert.Zero(t, cachedTokens(t, chat(keyBeta, `"cache_salt":"shared-guess",`)), "beta cannot reach acme's namespace")
	_, has := tap.last()["cache_salt"]
	assert.True(t, has, "without isolation the client's own salt passes through")
}

// On a replica started with --scheduling-policy priority, Sluice writes
// the request's band as vLLM's priority; the client's own never reaches
// any replica.
func TestPrioritySchedulingReplica(t *testing.T) {
	t.Parallel()
	cfg := sim.DefaultConfig()
	cfg.SchedulingPolicy = sim.PolicyPriority
	tap := &bodyTap{}
	rep := startSimWrapped(t, cfg, tap.wrap)
	plain := &bodyTap{}
	rep2 := startSimWrapped(t, sim.DefaultConfig(), plain.wrap)
	c := nodeConfig(t, []*simReplica{rep, rep2}, "    priority: 3\n", "")
	c.Upstream.Replicas[0].PriorityScheduling = true
	c.Upstream.Replicas[1].Models = []string{"other-model"} // only r0 serves sim-model
	n := startNode(t, c)
	body := `{"model":"sim-model","max_tokens":4,"priority":-100,"messages":[{"role":"user","content":"hi"}]}`
	r := n.call(t, "/v1/chat/completions", keyAcme, body)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.EqualValues(t, 3, tap.last()["priority"], "the tenant's band, not the client's -100")
	r = n.call(t, "/v1/chat/completions", keyAcme, body, "X-Priority", "7")
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.EqualValues(t, 7, tap.last()["priority"], "a request may lower its own priority")
	r = n.call(t, "/v1/embeddings", keyAcme, `{"model":"sim-model","input":"x","priority":-100}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	assert.EqualValues(t, 3, tap.last()["priority"])
}
