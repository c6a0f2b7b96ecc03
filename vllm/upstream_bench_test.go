package vllm_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/vllm"
	"github.com/sluicehq/sluice/vllm/sim"
)

func cpuNanos() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkNonStreamedClient compares the two ways to serve a non-streamed
// client: forcing stream:true upstream and re-assembling
// the body from the chunks (before), or sending the request non-streamed
// and passing vLLM's body through, or, for the abort evidence, sending it
// as a stream of a coarse stream_interval (sse-interval-N, what
// upstream.non_streamed_interval does) and re-assembling that. One
// simulated replica in process:
// cpu-ns/op is the CPU of Sluice's client side and the replica together,
// wire-B/op the response bytes. 200 output tokens per request.
func BenchmarkNonStreamedClient(b *testing.B) {
	cfg := sim.DefaultConfig()
	cfg.Model = "m"
	cfg.DecodeStep = 20 * time.Microsecond
	cfg.PrefillTPS = 1e9
	r, err := sim.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	url := "http://" + ln.Addr().String()
	client := vllm.NewClient(vllm.Config{})
	const body = `{"model":"m","messages":[{"role":"user","content":"tell me a long story"}],"max_tokens":200,"ignore_eos":true}`
	for _, mode := range []struct {
		name     string
		stream   bool
		interval int // > 0: the non-streamed request sent as a stream of this interval
	}{{"sse-assembled", true, 0}, {"whole", false, 0}, {"sse-interval-16", false, 16}, {"sse-interval-64", false, 64}} {
		b.Run(mode.name, func(b *testing.B) {
			client.CloseIdleConnections()
			cb := body
			if mode.stream {
				cb = `{"model":"m","messages":[{"role":"user","content":"tell me a long story"}],"max_tokens":200,"ignore_eos":true,"stream":true}`
			}
			req, err := vllm.Parse(vllm.EndpointChat, []byte(cb), vllm.CountOptions{})
			if err != nil {
				b.Fatal(err)
			}
			up := req.RewriteWith(nil, 200, vllm.RewriteOptions{StreamInterval: mode.interval})
			var wire int64
			b.ReportAllocs()
			start := cpuNanos()
			for b.Loop() {
				s, err := client.Stream(context.Background(), url, "/v1/chat/completions", up, "")
				if err != nil {
					b.Fatal(err)
				}
				a := vllm.NewAssembler(vllm.EndpointChat)
				for {
					ev, err := s.Next()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					wire += int64(len(ev.Raw))
					if err := a.Add(ev); err != nil {
						b.Fatal(err)
					}
				}
				out, err := a.Body()
				if err != nil || len(out) == 0 {
					b.Fatal(err)
				}
				if u := s.Usage(); !u.Final || u.CompletionTokens != 200 {
					b.Fatalf("usage %+v", u)
				}
				_ = s.Close()
			}
			b.ReportMetric(float64(cpuNanos()-start)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(wire)/float64(b.N), "wire-B/op")
		})
	}
	_ = http.StatusOK
}

// BenchmarkExactCount is the cost Sluice adds when the bytes bound would
// refuse or cut a request and the replica's /tokenize counts it exactly
// : a 2,000-word chat message, against the in-process
// simulator (loopback HTTP plus the replica's tokenizer), next to the bytes
// bound itself.
func BenchmarkExactCount(b *testing.B) {
	cfg := sim.DefaultConfig()
	cfg.Model = "m"
	cfg.MaxModelLen = 8192
	r, err := sim.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	url := "http://" + ln.Addr().String()
	client := vllm.NewClient(vllm.Config{})
	msg := make([]byte, 0, 12000)
	for i := range 2000 {
		if i > 0 {
			msg = append(msg, ' ')
		}
		msg = append(msg, []string{"queue", "tokens", "fair", "budget", "replica"}[i%5]...)
	}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + string(msg) + `"}]}`)
	b.Run("bytes-bound", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := vllm.Parse(vllm.EndpointChat, body, vllm.CountOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tokenize", func(b *testing.B) {
		req, err := vllm.Parse(vllm.EndpointChat, body, vllm.CountOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := client.Tokenize(context.Background(), url, "m", req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
