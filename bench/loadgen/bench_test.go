package loadgen

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bench/workload"
)

func sseBody(chunks int) string {
	var b strings.Builder
	for range chunks {
		b.WriteString("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" tok\",\"finish_reason\":null}]}\n\n")
	}
	b.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1024,\"completion_tokens\":128}}\n\ndata: [DONE]\n\n")
	return b.String()
}

// BenchmarkSSEReader measures event splitting per 128-chunk stream.
func BenchmarkSSEReader(b *testing.B) {
	body := sseBody(128)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		sr := NewSSEReader(strings.NewReader(body), func() time.Duration { return 0 })
		for {
			if _, err := sr.Next(); err != nil {
				break
			}
		}
	}
}

// BenchmarkReadStream measures SSE parsing plus chunk decoding and record
// keeping for one 128-token response (the client's per-request CPU cost).
func BenchmarkReadStream(b *testing.B) {
	body := sseBody(128)
	r := &runner{t0: time.Now()}
	q := &workload.Request{OutputLen: 128}
	b.ReportAllocs()
	for b.Loop() {
		rec := Record{First: -1, FirstContent: -1, Done: -1}
		r.readStream(context.Background(), strings.NewReader(body), func(error) {}, q, &rec)
		if rec.Outcome != Success {
			b.Fatal(rec.Outcome, rec.Reason)
		}
	}
}

// BenchmarkBody measures building one 1024-token completions body.
func BenchmarkBody(b *testing.B) {
	q := &workload.Request{InputLen: 1024, OutputLen: 128, PromptSeed: 7}
	b.ReportAllocs()
	for b.Loop() {
		_ = Body("openai", "model", nil, q, 1, true)
	}
}

// BenchmarkRunLoopback sends 200 requests at rate inf to a loopback stub
// that answers a 16-chunk stream at once: the generator's end-to-end cost
// per request (ns/op is per 200 requests).
func BenchmarkRunLoopback(b *testing.B) {
	body := sseBody(16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.Copy(w, bytes.NewReader([]byte(body)))
	}))
	defer srv.Close()
	reqs := make([]workload.Request, 200)
	for i := range reqs {
		reqs[i] = workload.Request{N: i, InputLen: 64, OutputLen: 16}
	}
	sc := &workload.Schedule{Tenants: []workload.Plan{{Name: "t", Weight: 1}}, Requests: reqs}
	client := &http.Client{Transport: NewTransport(256)}
	b.ReportAllocs()
	for b.Loop() {
		res, err := Run(context.Background(), sc, Config{Targets: []string{srv.URL}, Model: "m", Client: client})
		if err != nil || res.Records[199].Outcome != Success {
			b.Fatal(err)
		}
	}
}
