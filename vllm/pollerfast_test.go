package vllm

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakePolls stands in for pollReplica: it records when each replica was
// polled (fake time) and fails the replicas named in fail.
type fakePolls struct {
	mu   sync.Mutex
	at   map[string][]time.Duration
	t0   time.Time
	fail map[string]bool
}

func (f *fakePolls) poll(_ context.Context, prev *Replica) *Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at[prev.Name] = append(f.at[prev.Name], time.Since(f.t0))
	r := *prev
	r.CheckedAt = time.Now()
	if f.fail[prev.Name] {
		r.Failures++
	} else {
		r.Failures, r.Up = 0, true
	}
	return &r
}

func (f *fakePolls) times(name string) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.at[name]...)
}

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// TestPollerFastInterval: a replica for which Fast reports true is polled
// every FastInterval, the others every Interval on the same ticks; a
// replica turning fast is polled at the next tick, one turning slow waits
// out Interval from its last poll; a failing one stays at Interval.
func TestPollerFastInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fastA, fastC atomic.Bool
		fastA.Store(true)
		fastC.Store(true)
		p, err := NewPoller(PollerConfig{
			Replicas: []Target{{Name: "a", URL: "http://a"}, {Name: "b", URL: "http://b"}, {Name: "c", URL: "http://c"}},
			Interval: time.Second, FastInterval: 200 * time.Millisecond,
			Fast: func(name string) bool {
				switch name {
				case "a":
					return fastA.Load()
				case "c":
					return fastC.Load()
				}
				return false
			},
		}, nil, nil)
		require.NoError(t, err)
		f := &fakePolls{at: map[string][]time.Duration{}, t0: time.Now(), fail: map[string]bool{"c": true}}
		p.pollFn = f.poll
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()

		time.Sleep(1100 * time.Millisecond) // fake time: the bubble's clock
		synctest.Wait()
		assert.Equal(t, ms(0, 200, 400, 600, 800, 1000), f.times("a"), "unlearned and busy: every FastInterval")
		assert.Equal(t, ms(0, 1000), f.times("b"), "learned or idle: every Interval")
		assert.Equal(t, ms(0, 1000), f.times("c"), "a failing replica stays at Interval: down_after counts seconds")

		fastA.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Equal(t, ms(0, 200, 400, 600, 800, 1000, 2000, 3000), f.times("a"), "back to Interval from its last poll")
		cancel()
		require.NoError(t, <-done)
	})
}

// TestPollerFastTurnsOn: an idle replica that turns busy is polled at the
// next FastInterval tick, not at the end of its Interval.
func TestPollerFastTurnsOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fast atomic.Bool
		p, err := NewPoller(PollerConfig{
			Replicas: []Target{{Name: "a", URL: "http://a"}},
			Interval: time.Second, FastInterval: 200 * time.Millisecond,
			Fast: func(string) bool { return fast.Load() },
		}, nil, nil)
		require.NoError(t, err)
		f := &fakePolls{at: map[string][]time.Duration{}, t0: time.Now()}
		p.pollFn = f.poll
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(300 * time.Millisecond)
		fast.Store(true)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, ms(0, 400, 600, 800), f.times("a"))
		cancel()
		require.NoError(t, <-done)

		// Without Fast, or with FastInterval not below Interval, every poll
		// is Interval apart.
		for _, cfg := range []PollerConfig{
			{Interval: time.Second, FastInterval: 200 * time.Millisecond},
			{Interval: time.Second, FastInterval: time.Second, Fast: func(string) bool { return true }},
		} {
			cfg.Replicas = []Target{{Name: "a", URL: "http://a"}}
			p, err := NewPoller(cfg, nil, nil)
			require.NoError(t, err)
			f := &fakePolls{at: map[string][]time.Duration{}, t0: time.Now()}
			p.pollFn = f.poll
			ctx, cancel := context.WithCancel(t.Context())
			go func() { done <- p.Run(ctx) }()
			time.Sleep(2100 * time.Millisecond)
			synctest.Wait()
			assert.Equal(t, ms(0, 1000, 2000), f.times("a"))
			cancel()
			require.NoError(t, <-done)
		}
	})
}
