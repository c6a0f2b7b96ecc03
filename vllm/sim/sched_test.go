package sim

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lastFlush is when a streamed response finished.
func lastFlush(t *testing.T, rec *timedRecorder) time.Time {
	ev := rec.events()
	require.NotEmpty(t, ev)
	return ev[len(ev)-1].at
}

func waitCompleted(b *bubble, n int64) {
	synctest.Wait()
	for b.r.Stats().Completed+b.r.Stats().Aborted < n {
		time.Sleep(time.Millisecond)
		synctest.Wait()
	}
}

func TestPriorityOrdersTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.MaxNumSeqs = 1
		cfg.SchedulingPolicy = PolicyPriority
		cfg.DecodeStep = 10 * time.Millisecond
		b := newIdleBubble(t, cfg)
		recs := map[string]*timedRecorder{}
		for _, p := range []struct {
			name string
			prio int
		}{{"a", 0}, {"b", 5}, {"c", 1}} {
			recs[p.name] = b.do(t.Context(), "/v1/completions",
				fmt.Sprintf(`{"model":"sim-model","prompt":"x","max_tokens":3,"ignore_eos":true,"stream":true,"priority":%d}`, p.prio), p.name)
			synctest.Wait() // arrival order a, b, c
		}
		b.start()
		waitCompleted(b, 3)
		a, bb, c := lastFlush(t, recs["a"]), lastFlush(t, recs["b"]), lastFlush(t, recs["c"])
		assert.True(t, a.Before(c), "priority 0 before 1")
		assert.True(t, c.Before(bb), "priority 1 before 5, although b arrived first")
		b.stop()
	})
}

func TestPreemptionVictim(t *testing.T) {
	tests := []struct {
		name        string
		policy      string
		firstFinish string
	}{
		{"fcfs preempts the newest", PolicyFCFS, "old"},
		{"priority preempts the worst", PolicyPriority, "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.KVTokens, cfg.BlockSize, cfg.MaxModelLen = 64, 16, 64
				cfg.SchedulingPolicy = tt.policy
				cfg.DecodeStep = 10 * time.Millisecond
				b := newIdleBubble(t, cfg)
				prio := map[string]int{"old": 5, "new": 0}
				if tt.policy == PolicyFCFS {
					prio = map[string]int{"old": 0, "new": 0}
				}
				recs := map[string]*timedRecorder{}
				for _, name := range []string{"old", "new"} {
					recs[name] = b.do(t.Context(), "/v1/completions",
						fmt.Sprintf(`{"model":"sim-model","prompt":%s,"max_tokens":40,"ignore_eos":true,"stream":true,"priority":%d}`, tokenIDPrompt(16), prio[name]), name)
					synctest.Wait()
				}
				b.start()
				waitCompleted(b, 2)
				assert.Equal(t, int64(1), b.r.Stats().Preemptions)
				old, nw := lastFlush(t, recs["old"]), lastFlush(t, recs["new"])
				if tt.firstFinish == "old" {
					assert.True(t, old.Before(nw), "old finished at %v, new at %v", old, nw)
				} else {
					assert.True(t, nw.Before(old), "new finished at %v, old at %v", nw, old)
				}
				assert.Equal(t, int64(80), b.r.Stats().GenerationTokens)
				b.stop()
			})
		})
	}
}

func TestStepFaults(t *testing.T) {
	t.Run("spike", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DecodeStep = 10 * time.Millisecond
			cfg.PrefillTPS = 1e9
			cfg.Faults.SpikeRate = 1
			cfg.Faults.Spike = 5 * time.Millisecond
			b := newBubble(t, cfg)
			start := time.Now()
			rec := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":4,"ignore_eos":true,"stream":true}`, "s")
			waitCompleted(b, 1)
			want := 4*15*time.Millisecond + time.Nanosecond // + 1 prompt token at 1e9 tokens/s
			assert.Equal(t, want, b.r.Stats().BusyTime)
			assert.Equal(t, want, lastFlush(t, rec).Sub(start))
			b.stop()
		})
	})
	t.Run("stall is not busy", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DecodeStep = 10 * time.Millisecond
			cfg.PrefillTPS = 1e9
			cfg.Faults.StallRate = 0.5
			cfg.Faults.Stall = 100 * time.Millisecond
			b := newBubble(t, cfg)
			start := time.Now()
			rec := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":20,"ignore_eos":true,"stream":true}`, "s")
			waitCompleted(b, 1)
			elapsed := lastFlush(t, rec).Sub(start)
			assert.Equal(t, 20*10*time.Millisecond+time.Nanosecond, b.r.Stats().BusyTime)
			assert.Greater(t, elapsed, 20*10*time.Millisecond+100*time.Millisecond, "some steps stalled")
			assert.Equal(t, time.Duration(0), (elapsed-b.r.Stats().BusyTime)%(100*time.Millisecond), "stalls are whole")
			b.stop()
		})
	})
}

func TestStreamRoleChunkAndInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.StreamInterval = 4
		b := newBubble(t, cfg)
		rec := b.do(t.Context(), "/v1/chat/completions",
			`{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":10,"ignore_eos":true,"stream":true,"stream_options":{"continuous_usage_stats":true}}`, "si")
		waitCompleted(b, 1)
		ev := sseEvents(t, rec.body)
		first := decodeChunk(t, ev[0])
		require.NotNil(t, first.Choices[0].Delta)
		assert.Equal(t, "assistant", first.Choices[0].Delta.Role)
		assert.Equal(t, 0, first.Usage.CompletionTokens)
		var cum []int
		for _, e := range ev[1 : len(ev)-2] {
			cum = append(cum, decodeChunk(t, e).Usage.CompletionTokens)
		}
		// first token at once, then packs of 4, then the rest with the finish.
		assert.Equal(t, []int{1, 5, 9, 10}, cum)
		b.stop()
	})
}

func TestChunkedPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.PrefillTPS = 10000
		cfg.DecodeStep = 10 * time.Millisecond
		cfg.DecodeStepPerSeq = time.Millisecond
		cfg.MaxNumBatchedTokens = 256
		b := newIdleBubble(t, cfg)
		start := time.Now()
		long := b.do(t.Context(), "/v1/completions",
			`{"model":"sim-model","prompt":`+tokenIDPrompt(1000)+`,"max_tokens":3,"ignore_eos":true,"stream":true}`, "long")
		synctest.Wait()
		b.start()
		waitCompleted(b, 1)
		ev := tokenEvents(t, long)
		require.Len(t, ev, 3)
		// chunks of 256, 256, 256, 232: four steps of 10ms plus 1000/10000 s.
		assert.Equal(t, 140*time.Millisecond, ev[0].Sub(start))
		assert.Equal(t, int64(1000), b.r.Stats().PromptTokens)

		// A decode shares the budget: one token for it, 255 for the prompt.
		ctx, cancel := context.WithCancel(t.Context())
		dec := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":50,"ignore_eos":true,"stream":true}`, "dec")
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		n0 := len(tokenEvents(t, dec))
		gen0 := b.r.Stats().GenerationTokens
		aborted := b.do(ctx, "/v1/completions",
			`{"model":"sim-model","prompt":`+tokenIDPrompt(2000)+`,"max_tokens":3,"ignore_eos":true,"stream":true}`, "ab")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		cancel() // during a chunk step of the long prefill
		time.Sleep(60 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int64(1), b.r.Stats().Aborted, "dropped at the end of the chunk step")
		assert.Empty(t, tokenEvents(t, aborted))
		assert.Greater(t, len(tokenEvents(t, dec)), n0, "decodes go on during a chunked prefill")
		assert.Greater(t, b.r.Stats().GenerationTokens, gen0)
		b.stop()
	})
}
