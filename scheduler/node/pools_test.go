package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// modelTally counts, per replica, the generation requests it received by
// model and the 404s it answered.
type modelTally struct {
	mu       sync.Mutex
	byModel  map[string]int
	notFound atomic.Int64
}

func (m *modelTally) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			b, _ := io.ReadAll(r.Body)
			var body struct {
				Model string `json:"model"`
			}
			_ = json.Unmarshal(b, &body)
			m.mu.Lock()
			m.byModel[body.Model]++
			m.mu.Unlock()
			r.Body = io.NopCloser(strings.NewReader(string(b)))
		}
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.status == http.StatusNotFound {
			m.notFound.Add(1)
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// TestModelPools: two replicas serve a big model, a third a small model
// and a LoRA adapter on it. 300 mixed requests all land on a replica that
// serves their model (0 upstream 404s); an unknown model is Sluice's own
// 404 model_not_found; a tenant restricted to one model sees only it.
func TestModelPools(t *testing.T) {
	t.Parallel()
	big := sim.DefaultConfig()
	big.Model = "big-70b"
	big.OutputLenMax = 8
	small := sim.DefaultConfig()
	small.Model = "small-7b"
	small.OutputLenMax = 8
	small.LoRAModules = []sim.LoRAModule{{Name: "small-sql-lora", Path: "/adapters/sql"}}
	var tallies [3]*modelTally
	var reps []*simReplica
	for i, c := range []sim.Config{big, big, small} {
		tallies[i] = &modelTally{byModel: map[string]int{}}
		c.ReplicaIndex = i
		reps = append(reps, startSimWrapped(t, c, tallies[i].wrap))
	}
	var b strings.Builder
	b.WriteString("upstream:\n  scrape_interval: 50ms\n  replicas:\n")
	for i, r := range reps {
		fmt.Fprintf(&b, "    - {name: r%d, url: %q}\n", i, r.url)
	}
	b.WriteString("gpu: {telemetry: off}\nserver: {drain_timeout: 5s}\n")
	fmt.Fprintf(&b, "tenants:\n  - {name: acme, concurrency: 64, api_keys: [%q]}\n", config.HashKey(keyAcme))
	fmt.Fprintf(&b, "  - {name: beta, models: [small-7b], api_keys: [%q]}\n", config.HashKey(keyBeta))
	cfg, err := config.Parse([]byte(b.String()))
	require.NoError(t, err)
	n := startNode(t, cfg)

	type card struct {
		ID          string  `json:"id"`
		Parent      *string `json:"parent"`
		MaxModelLen int64   `json:"max_model_len"`
	}
	list := func(key string) []card {
		body, err := n.get(t, "/v1/models", key)
		require.NoError(t, err)
		var out struct {
			Data []card `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &out), body)
		return out.Data
	}
	eventually(t, "every replica's models", func() bool { return len(list(keyAcme)) == 3 })
	cards := list(keyAcme)
	assert.Equal(t, "big-70b", cards[0].ID)
	assert.Equal(t, int64(4096), cards[0].MaxModelLen)
	assert.Equal(t, "small-7b", cards[1].ID)
	assert.Equal(t, "small-sql-lora", cards[2].ID)
	require.NotNil(t, cards[2].Parent)
	assert.Equal(t, "small-7b", *cards[2].Parent, "a LoRA adapter lists its base model, as vLLM does")
	if bc := list(keyBeta); assert.Len(t, bc, 1) {
		assert.Equal(t, "small-7b", bc[0].ID, "a restricted tenant sees only its models")
	}

	models := []string{"big-70b", "small-7b", "small-sql-lora"}
	var wg sync.WaitGroup
	var ok atomic.Int64
	sem := make(chan struct{}, 24) // a busy client, not a stampede on a shared CI host
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi %d"}],"max_tokens":4}`, models[i%3], i)
			r := n.call(t, "/v1/chat/completions", keyAcme, body)
			var resp struct {
				Model string `json:"model"`
			}
			if r.StatusCode == 200 && json.Unmarshal(r.Body, &resp) == nil && resp.Model == models[i%3] {
				ok.Add(1) // answered by the model (or adapter) asked for
			} else {
				t.Errorf("request %d (%s): %d %s", i, models[i%3], r.StatusCode, r.Body)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(300), ok.Load())
	got := map[string]int{}
	for i, tl := range tallies {
		assert.Zero(t, tl.notFound.Load(), "replica r%d answered 404", i)
		for m, c := range tl.byModel {
			got[fmt.Sprintf("r%d/%s", i, m)] = c
		}
	}
	bigN := got["r0/big-70b"] + got["r1/big-70b"]
	assert.Equal(t, 100, bigN)
	assert.Positive(t, got["r0/big-70b"], "both big replicas take work")
	assert.Positive(t, got["r1/big-70b"], "both big replicas take work")
	assert.Equal(t, 100, got["r2/small-7b"])
	assert.Equal(t, 100, got["r2/small-sql-lora"])
	assert.Len(t, got, 4, "no model reached a replica that does not serve it: %v", got)

	r := n.call(t, "/v1/chat/completions", keyAcme, `{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, 404, r.StatusCode)
	code, _ := errorCode(t, r.Body)
	assert.Equal(t, "model_not_found", code)
	r = n.call(t, "/v1/chat/completions", keyBeta, `{"model":"big-70b","messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, 404, r.StatusCode, "a model outside the tenant's list is not found for it")
	code, _ = errorCode(t, r.Body)
	assert.Equal(t, "model_not_found", code)
	for i, tl := range tallies {
		assert.Zero(t, tl.notFound.Load(), "replica r%d answered 404", i)
	}
}
