package sim

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokenIDPrompt returns a JSON token-id array of n ids.
func tokenIDPrompt(n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", i%1000+1)
	}
	b.WriteByte(']')
	return b.String()
}

// bubble runs the replica's engine in a synctest bubble and returns a
// function that runs one request through its handler.
type bubble struct {
	t      *testing.T
	r      *Replica
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

func newBubble(t *testing.T, cfg Config) *bubble {
	b := newIdleBubble(t, cfg)
	b.start()
	return b
}

// newIdleBubble builds the replica without starting its engine, so that
// requests can queue first and enter the same step.
func newIdleBubble(t *testing.T, cfg Config) *bubble {
	r, err := New(cfg)
	require.NoError(t, err)
	return &bubble{t: t, r: r}
}

func (b *bubble) start() {
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Go(func() { assert.NoError(b.t, b.r.Run(ctx)) })
}

// do starts one request; its recorder fills as the handler writes.
func (b *bubble) do(ctx context.Context, path, body string, id string) *timedRecorder {
	rec := newTimedRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(body))
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	b.wg.Go(func() { b.r.Handler().ServeHTTP(rec, req) })
	return rec
}

func (b *bubble) stop() {
	b.cancel()
	b.wg.Wait()
}

// tokenEvents returns the flush times of the chunks that carry tokens.
func tokenEvents(t *testing.T, rec *timedRecorder) []time.Time {
	var out []time.Time
	for _, ev := range rec.events() {
		for _, d := range sseEvents(t, []byte(ev.data)) {
			if d == "[DONE]" {
				continue
			}
			c := decodeChunk(t, d)
			if len(c.Choices) > 0 && c.Choices[0].Text != nil && *c.Choices[0].Text != "" {
				out = append(out, ev.at)
			}
		}
	}
	return out
}

func within(t *testing.T, got, want time.Duration, frac float64, msg string) {
	t.Helper()
	d := got - want
	if d < 0 {
		d = -d
	}
	assert.LessOrEqual(t, float64(d), frac*float64(want), "%s: got %s, want %s ±%.0f%%", msg, got, want, frac*100)
}

func TestTimingLonePrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.PrefillTPS = 10000
		cfg.DecodeStep = 10 * time.Millisecond
		cfg.DecodeStepPerSeq = time.Millisecond
		b := newBubble(t, cfg)
		start := time.Now()
		rec := b.do(t.Context(), "/v1/completions",
			`{"model":"sim-model","prompt":`+tokenIDPrompt(1000)+`,"max_tokens":20,"ignore_eos":true,"stream":true}`, "lone")
		synctest.Wait()
		for len(tokenEvents(t, rec)) < 20 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		ev := tokenEvents(t, rec)
		require.Len(t, ev, 20)
		// prefill 1000/10000 s = 100ms plus one step of 10ms (nothing decoding yet).
		within(t, ev[0].Sub(start), 110*time.Millisecond, 0.10, "time to first token")
		assert.Equal(t, 110*time.Millisecond, ev[0].Sub(start), "exact under a fake clock")
		for i := 1; i < len(ev); i++ {
			// batch 1: 10ms + 1ms per decoding sequence.
			assert.Equal(t, 11*time.Millisecond, ev[i].Sub(ev[i-1]), "gap before token %d", i)
		}
		st := b.r.Stats()
		assert.Equal(t, int64(20), st.GenerationTokens)
		assert.Equal(t, 110*time.Millisecond+19*11*time.Millisecond, st.BusyTime)
		b.stop()
	})
}

func TestTimingBatchSlowsDecode(t *testing.T) {
	tests := []struct {
		name     string
		requests int
		wantGap  time.Duration
	}{
		{"batch 1", 1, 12 * time.Millisecond},
		{"batch 4", 4, 18 * time.Millisecond},
		{"batch 8", 8, 26 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.DecodeStep = 10 * time.Millisecond
				cfg.DecodeStepPerSeq = 2 * time.Millisecond
				b := newIdleBubble(t, cfg)
				var recs []*timedRecorder
				for i := range tt.requests {
					recs = append(recs, b.do(t.Context(), "/v1/completions",
						`{"model":"sim-model","prompt":"a b c","max_tokens":10,"ignore_eos":true,"stream":true}`, fmt.Sprint("r", i)))
				}
				synctest.Wait()
				b.start()
				synctest.Wait()
				for b.r.Stats().FinishedSeqs < int64(tt.requests) {
					time.Sleep(time.Millisecond)
					synctest.Wait()
				}
				for _, rec := range recs {
					ev := tokenEvents(t, rec)
					require.Len(t, ev, 10)
					for i := 2; i < len(ev); i++ {
						assert.Equal(t, tt.wantGap, ev[i].Sub(ev[i-1]), "gap before token %d", i)
					}
				}
				b.stop()
			})
		})
	}
}

func TestMaxNumSeqsQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.MaxNumSeqs = 4
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		for i := range 8 {
			b.do(t.Context(), "/v1/completions",
				`{"model":"sim-model","prompt":"x y","max_tokens":5,"ignore_eos":true}`, fmt.Sprint("q", i))
		}
		synctest.Wait()
		time.Sleep(15 * time.Millisecond) // into the second step
		synctest.Wait()
		st := b.r.Stats()
		assert.Equal(t, int64(4), st.Running)
		assert.Equal(t, int64(4), st.Waiting)
		m := scrapeGatherer(t, b.r)
		assert.InDelta(t, 4.0, m.value(t, "vllm:num_requests_running"), 1e-9)
		assert.InDelta(t, 4.0, m.value(t, "vllm:num_requests_waiting"), 1e-9)
		for b.r.Stats().Completed < 8 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		st = b.r.Stats()
		assert.Equal(t, int64(40), st.GenerationTokens)
		assert.Equal(t, int64(0), st.Running)
		assert.Equal(t, int64(0), st.Waiting)
		b.stop()
	})
}

func TestKVExhaustionPreempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.KVTokens = 64
		cfg.BlockSize = 16
		cfg.MaxModelLen = 64
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		var recs []*timedRecorder
		for i := range 2 {
			recs = append(recs, b.do(t.Context(), "/v1/completions",
				`{"model":"sim-model","prompt":`+tokenIDPrompt(16)+`,"max_tokens":40,"ignore_eos":true}`, fmt.Sprint("kv", i)))
		}
		synctest.Wait()
		for b.r.Stats().Completed < 2 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		st := b.r.Stats()
		assert.GreaterOrEqual(t, st.Preemptions, int64(1))
		assert.Equal(t, int64(80), st.GenerationTokens, "preemption never loses or repeats tokens")
		assert.Greater(t, st.PromptTokens, int64(32), "recomputation prefills again")
		m := scrapeGatherer(t, b.r)
		assert.InDelta(t, float64(st.Preemptions), m.value(t, "vllm:num_preemptions_total"), 1e-9)
		for _, rec := range recs {
			assert.Contains(t, string(rec.body), `"completion_tokens":40,`)
		}
		assert.Equal(t, int64(0), st.KVBlocksUsed)
		b.stop()
	})
}

func TestAbortInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		ctx, cancel := context.WithCancel(t.Context())
		rec := b.do(ctx, "/v1/completions",
			`{"model":"sim-model","prompt":"a b","max_tokens":100,"ignore_eos":true,"stream":true}`, "ab")
		time.Sleep(55 * time.Millisecond)
		synctest.Wait()
		require.Len(t, tokenEvents(t, rec), 5)
		genAtClose := b.r.Stats().GenerationTokens
		cancel()
		time.Sleep(10 * time.Millisecond) // one decode step
		synctest.Wait()
		st := b.r.Stats()
		assert.Equal(t, int64(1), st.Aborted)
		assert.Equal(t, int64(0), st.Running)
		assert.Equal(t, genAtClose, st.GenerationTokens, "no token after the step that saw the abort")
		assert.Equal(t, int64(0), st.KVBlocksUsed)
		time.Sleep(time.Second)
		assert.Equal(t, genAtClose, b.r.Stats().GenerationTokens)
		b.stop()
	})
}

func TestGPUBusyExcludesIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.DecodeStep = 10 * time.Millisecond
		cfg.PrefillTPS = 1000
		b := newBubble(t, cfg)
		b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":`+tokenIDPrompt(50)+`,"max_tokens":5,"ignore_eos":true}`, "g1")
		synctest.Wait()
		for b.r.Stats().Completed < 1 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		time.Sleep(3 * time.Second) // idle
		b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":3,"ignore_eos":true}`, "g2")
		synctest.Wait()
		for b.r.Stats().Completed < 2 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		// 50ms prefill + 5 steps of 10ms, then 1ms prefill + 3 steps.
		want := 50*time.Millisecond + 50*time.Millisecond + time.Millisecond + 30*time.Millisecond
		assert.Equal(t, want, b.r.Stats().BusyTime)
		m := scrapeGatherer(t, b.r)
		assert.InDelta(t, want.Seconds(), m.value(t, "sim_gpu_busy_seconds_total"), 1e-9)
		util := m.value(t, "sim_gpu_utilization_ratio")
		assert.Greater(t, util, 0.0)
		assert.Less(t, util, 0.1)
		b.stop()
	})
}
