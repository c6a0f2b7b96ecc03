package vllm

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// Native fuzz tests. `go test` runs only the seeds (fast); run one target
// with e.g. `go test -run=^$ -fuzz=FuzzParse -fuzztime=60s ./vllm`.

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"n":2,"max_tokens":5}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"prompt":["a","b"],"max_tokens":3}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"prompt":[1,2,3],"priority":-5,"ignore_eos":true}`,
		`{"\u006dodel":"m","prompt":"x","stream":null}`,
		`{}`, `[]`, `{"messages":`, `{"prompt":"\ud800"}`,
	} {
		f.Add(uint8(1), []byte(s))
		f.Add(uint8(2), []byte(s))
	}
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		e := Endpoint(ep%2 + 1)
		r, err := Parse(e, body, CountOptions{})
		if err != nil {
			return
		}
		for _, n := range r.InputTokens {
			if n < 0 {
				t.Fatalf("negative input count %d", n)
			}
		}
		out := r.Rewrite(nil, 7)
		if !json.Valid(out) {
			t.Fatalf("rewrite produced invalid JSON from %q: %q", body, out)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("rewrite: %v", err)
		}
		if (r.Stream && string(m["stream"]) != "true") || (!r.Stream && string(m["stream_options"]) != string(bytesOr(r, "stream_options"))) || string(m["max_tokens"]) != "7" {
			t.Fatalf("rewrite lost the forced fields: %q", out)
		}
		r2, err := Parse(e, out, CountOptions{})
		if err != nil {
			t.Fatalf("rewritten body does not parse: %v", err)
		}
		if r2.Model != r.Model || r2.N != r.N || r2.MaxTokens != 7 {
			t.Fatalf("rewrite changed fields: %+v vs %+v", r2, r)
		}
		_, _ = r.Plan(Limits{MaxModelLen: 100, TenantMaxOutput: 10})
	})
}

func FuzzStream(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n",
		"data: {\"error\":{\"type\":\"X\",\"code\":500}}\n\ndata: [DONE]\n\n",
		"data: {\"object\":\"error\",\"code\":\"x\"}\r\n\r\n",
		": c\n\ndata: a\ndata: b\n\n",
		"data: {\"choices\":[{\"index\":99999999999999999999}],\"usage\":{\"completion_tokens\":-1}}\n\n",
		"data: {\"choices\":[{\"index\":3}],\"usage\":{\"completion_tokens\":4}}\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s := NewStream(io.NopCloser(strings.NewReader(string(in))), "r", 4096)
		r := &Request{Endpoint: EndpointChat}
		a := NewAssembler(EndpointChat)
		var buf []byte
		for range 10000 {
			ev, err := s.Next()
			if err != nil {
				break
			}
			if len(ev.Raw) > 4096 {
				t.Fatalf("event over the cap: %d", len(ev.Raw))
			}
			buf, _ = ShapeChunk(buf[:0], ev, r)
			_ = a.Add(ev)
		}
		u := s.Usage()
		if u.PromptTokens < 0 || u.CompletionTokens < 0 {
			t.Fatalf("negative usage %+v", u)
		}
		if b, err := a.Body(); err == nil && !json.Valid(b) {
			t.Fatalf("assembled invalid JSON: %q", b)
		}
		_ = s.Close()
	})
}

func FuzzMetrics(f *testing.F) {
	for _, s := range []string{
		"vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3\n",
		"vllm:cache_config_info{num_gpu_blocks=\"10\",block_size=\"16\"} 1\n",
		"vllm:request_success_total{finished_reason=\"abort\",model_name=\"m\"} 2 1700000000\n",
		"vllm:kv_cache_usage_perc{model_name=\"a\\\"b\"} +Inf\n# HELP x\n",
		"vllm:num_requests_waiting{",
		"vllm:gpu_cache_usage_perc NaN\n",
	} {
		f.Add([]byte(s), "m")
	}
	f.Fuzz(func(t *testing.T, in []byte, model string) {
		m := ParseMetrics(in, model)
		for _, x := range m.counters() {
			if x.OK && x.V != x.V {
				t.Fatalf("NaN counter")
			}
		}
	})
}

// bytesOr returns the raw member name of r's body as Rewrite keeps it.
func bytesOr(r *Request, name string) []byte {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(r.Body(), &m)
	return m[name]
}
