package vllm

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// loopReader repeats one chunk forever.
type loopReader struct {
	chunk []byte
	off   int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], l.chunk[l.off:])
		n += c
		l.off = (l.off + c) % len(l.chunk)
	}
	return n, nil
}

const benchChunk = `data: {"id":"chatcmpl-6c1f0b6e8a7d4a3f9e2b","object":"chat.completion.chunk","created":1732000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":812,"total_tokens":1019,"completion_tokens":207}}` + "\n\n"

// BenchmarkStreamNext measures SSE framing plus usage extraction per chunk.
func BenchmarkStreamNext(b *testing.B) {
	s := NewStream(io.NopCloser(&loopReader{chunk: []byte(benchChunk)}), "r", 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChunk)))
	for b.Loop() {
		ev, err := s.Next()
		if err != nil || !ev.HasUsage {
			b.Fatal(err)
		}
	}
}

// BenchmarkShapeChunk measures stripping per-chunk usage for a client that
// did not ask for it.
func BenchmarkShapeChunk(b *testing.B) {
	s := NewStream(io.NopCloser(&loopReader{chunk: []byte(benchChunk)}), "r", 0)
	ev, err := s.Next()
	if err != nil {
		b.Fatal(err)
	}
	r := mustParse(b, EndpointChat, `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = ShapeChunk(buf[:0], ev, r)
	}
}

func benchBody() []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[`)
	sb.WriteString(`{"role":"system","content":"You are a helpful assistant. Answer briefly and cite sources when you can."}`)
	for i := range 6 {
		fmt.Fprintf(&sb, `,{"role":"user","content":"Question %d: what is the capital of France, and why is it \"famous\"?"}`, i)
		fmt.Fprintf(&sb, `,{"role":"assistant","content":"Answer %d: Paris. It is famous for the Eiffel Tower, museums and food."}`, i)
	}
	sb.WriteString(`],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],`)
	sb.WriteString(`"temperature":0.7,"top_p":0.95,"max_tokens":256,"stream":true,"stream_options":{"include_usage":true}}`)
	return []byte(sb.String())
}

// BenchmarkParseRewrite measures parsing, counting (bytes mode), planning and
// rewriting one ~1.6 KB chat request.
func BenchmarkParseRewrite(b *testing.B) {
	body := benchBody()
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r, err := Parse(EndpointChat, body, CountOptions{})
		if err != nil {
			b.Fatal(err)
		}
		p, err := r.Plan(Limits{MaxModelLen: 8192, TenantMaxOutput: 1024})
		if err != nil {
			b.Fatal(err)
		}
		dst = r.Rewrite(dst[:0], p.Cap)
	}
}

// BenchmarkRewrite measures Rewrite alone on a parsed request.
func BenchmarkRewrite(b *testing.B) {
	r, err := Parse(EndpointChat, benchBody(), CountOptions{})
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		dst = r.Rewrite(dst[:0], 256)
	}
}

func benchMetrics() []byte {
	var sb strings.Builder
	sb.WriteString(string(mustRead("testdata/metrics_vllm.txt")))
	// Histograms dominate a real vLLM /metrics page.
	for _, h := range []string{"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens"} {
		for i := range 30 {
			fmt.Fprintf(&sb, "%s_bucket{engine=\"0\",le=\"%d.0\",model_name=\"m\"} %d.0\n", h, i, i*10)
		}
		fmt.Fprintf(&sb, "%s_sum{engine=\"0\",model_name=\"m\"} 123.4\n%s_count{engine=\"0\",model_name=\"m\"} 300.0\n", h, h)
	}
	return []byte(sb.String())
}

// BenchmarkParseMetrics measures parsing a ~12 KB /metrics page.
func BenchmarkParseMetrics(b *testing.B) {
	text := benchMetrics()
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		m := ParseMetrics(text, "m")
		if !m.Running.OK {
			b.Fatal("running unknown")
		}
	}
}

// BenchmarkAssemble measures rebuilding a 200-chunk chat response.
func BenchmarkAssemble(b *testing.B) {
	var sb strings.Builder
	for range 200 {
		sb.WriteString(benchChunk)
	}
	sb.WriteString(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":812,"total_tokens":1012,"completion_tokens":200}}` + "\n\ndata: [DONE]\n\n")
	in := sb.String()
	b.ReportAllocs()
	for b.Loop() {
		s := NewStream(io.NopCloser(strings.NewReader(in)), "r", 0)
		a := NewAssembler(EndpointChat)
		for {
			ev, err := s.Next()
			if err != nil {
				break
			}
			if err := a.Add(ev); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := a.Body(); err != nil {
			b.Fatal(err)
		}
	}
}

func mustRead(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkStreamShape is a streamed chunk's whole JSON work for a client
// that did not ask for usage: Next (framing, usage) then ShapeChunk.
func BenchmarkStreamShape(b *testing.B) {
	s := NewStream(io.NopCloser(&loopReader{chunk: []byte(benchChunk)}), "r", 0)
	r := mustParse(b, EndpointChat, `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChunk)))
	for b.Loop() {
		ev, err := s.Next()
		if err != nil || !ev.HasUsage {
			b.Fatal(err)
		}
		buf, _ = ShapeChunk(buf[:0], ev, r)
	}
}
