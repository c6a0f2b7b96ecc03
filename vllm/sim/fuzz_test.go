package sim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzParseRequest feeds arbitrary bodies to the request parsing of every
// endpoint; it must answer (a request or a vLLM-shaped error), never panic.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"continuous_usage_stats":true}}`,
		`{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url"}]}],"n":2,"tools":[{"type":"function"}]}`,
		`{"model":"sim-model","prompt":["a","b"],"max_tokens":null,"min_tokens":3,"ignore_eos":true}`,
		`{"model":"sim-model","prompt":[[1,2],[3]],"priority":-1}`,
		`{"model":"sim-model","prompt":[1,2,3],"max_tokens":1e3}`,
		`{"prompt":"x","add_generation_prompt":true,"continue_final_message":true}`,
		`{"model":"x"}`, `[]`, `null`, `{"n":-5}`, "\xff\xfe", `{"prompt":"\u00e9\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	cfg := DefaultConfig().withDefaults()
	cfg.MaxModelLen = 64
	cfg.KVTokens = 1024
	r, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w, e := decodeWire(body)
		if e != nil {
			if e.status != http.StatusBadRequest {
				t.Fatalf("decode error status %d", e.status)
			}
			return
		}
		for _, k := range []kind{kindChat, kindCompletion} {
			g, e := parseGeneration(k, w, &cfg)
			if e != nil {
				if e.status != http.StatusBadRequest && e.status != http.StatusNotFound {
					t.Fatalf("parse error status %d", e.status)
				}
				b := appendErrorJSON(nil, e)
				if !bytes.HasPrefix(b, []byte(`{"error":{`)) {
					t.Fatalf("error body %s", b)
				}
				continue
			}
			for _, p := range g.prompts {
				if p+g.cap > cfg.MaxModelLen || g.cap < 1 || g.n < 1 || g.minTokens > g.cap {
					t.Fatalf("accepted an invalid request: prompt %d cap %d n %d min %d", p, g.cap, g.n, g.minTokens)
				}
			}
		}
		rec := httptest.NewRecorder()
		r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/tokenize", bytes.NewReader(body)))
		if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest && rec.Code != http.StatusNotFound {
			t.Fatalf("tokenize status %d", rec.Code)
		}
	})
}
