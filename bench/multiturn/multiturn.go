// Package multiturn is the prefix-sharing bench preset: a few shared
// system prompts and many multi-turn conversations, each turn's prompt
// extending the previous one with the assistant's answer and a new user
// message, streamed. It runs against any OpenAI-compatible base URL
// (a vLLM replica directly, HAProxy in front of several, or Sluice) and
// measures client-side time to first token; prefix-cache hit rates come
// from the replicas' vllm:prefix_cache_* counters.
package multiturn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
)

// Config shapes the workload. Zero fields take the defaults of Defaults.
type Config struct {
	// BaseURL is the API root, e.g. http://127.0.0.1:8080 (paths
	// /v1/chat/completions are appended).
	BaseURL string
	APIKey  string
	Model   string
	// SystemPrompts is the number of distinct shared system prompts.
	SystemPrompts int
	// SystemWords is the length of each system prompt in words.
	SystemWords int
	// Conversations and Turns: each conversation sends Turns requests in
	// sequence; Concurrency conversations run at once.
	Conversations, Turns, Concurrency int
	// UserWords per user message; MaxTokens per answer.
	UserWords, MaxTokens int
	// Seed makes the texts reproducible.
	Seed uint64
	// Client sends the requests; nil is a client without timeouts.
	Client *http.Client
	// Route, when set, picks the base URL per request instead of BaseURL
	// (a client-side router, e.g. an oracle in benchmarks).
	Route func(path string, body []byte) string
}

// Defaults is 4 system prompts of 300 words, 64 conversations of 8
// turns, 16 at a time, 150-word user messages and 32-token answers: about
// 3k tokens of history per conversation at its end, 190k in all, more
// than 4 replicas' default KV caches hold unless each keeps its own
// conversations.
func Defaults() Config {
	return Config{Model: "sim-model", SystemPrompts: 4, SystemWords: 300, Conversations: 64, Turns: 8,
		Concurrency: 16, UserWords: 150, MaxTokens: 32, Seed: 1}
}

func (c Config) withDefaults() Config {
	d := Defaults()
	for _, p := range []struct{ v, def *int }{
		{&c.SystemPrompts, &d.SystemPrompts}, {&c.SystemWords, &d.SystemWords}, {&c.Conversations, &d.Conversations},
		{&c.Turns, &d.Turns}, {&c.Concurrency, &d.Concurrency}, {&c.UserWords, &d.UserWords}, {&c.MaxTokens, &d.MaxTokens},
	} {
		if *p.v <= 0 {
			*p.v = *p.def
		}
	}
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
	return c
}

// Result is one run's client-side view.
type Result struct {
	Requests, Errors int
	// TTFT holds one time to first token per successful request, sorted.
	TTFT []time.Duration
	Wall time.Duration
}

// P50 is the median TTFT (0 without samples).
func (r Result) P50() time.Duration { return r.quantile(0.5) }

// P90 is the 90th percentile TTFT.
func (r Result) P90() time.Duration { return r.quantile(0.9) }

func (r Result) quantile(q float64) time.Duration {
	if len(r.TTFT) == 0 {
		return 0
	}
	return r.TTFT[min(len(r.TTFT)-1, int(q*float64(len(r.TTFT))))]
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "w%d", rng.IntN(5000))
	}
	return b.String()
}

// Run drives the workload until every conversation finished or ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5157))
	systems := make([]string, cfg.SystemPrompts)
	for i := range systems {
		systems[i] = "You are assistant " + fmt.Sprint(i) + ". " + words(rng, cfg.SystemWords)
	}
	convs := make(chan int)
	var mu sync.Mutex
	var res Result
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range convs {
				crng := rand.New(rand.NewPCG(cfg.Seed, uint64(c)+1))
				msgs := []message{{Role: "system", Content: systems[c%len(systems)]}}
				for range cfg.Turns {
					msgs = append(msgs, message{Role: "user", Content: words(crng, cfg.UserWords)})
					ttft, answer, err := turn(ctx, cfg, msgs)
					mu.Lock()
					res.Requests++
					if err != nil {
						res.Errors++
					} else {
						res.TTFT = append(res.TTFT, ttft)
					}
					mu.Unlock()
					if err != nil {
						break // the conversation cannot continue without its answer
					}
					msgs = append(msgs, message{Role: "assistant", Content: answer})
				}
			}
		}()
	}
	for c := range cfg.Conversations {
		select {
		case convs <- c:
		case <-ctx.Done():
		}
	}
	close(convs)
	wg.Wait()
	res.Wall = time.Since(start)
	slices.Sort(res.TTFT)
	return res, ctx.Err()
}

// turn sends one streamed chat request and returns its TTFT and answer.
func turn(ctx context.Context, cfg Config, msgs []message) (time.Duration, string, error) {
	body, _ := json.Marshal(map[string]any{"model": cfg.Model, "messages": msgs, "max_tokens": cfg.MaxTokens, "stream": true})
	base := cfg.BaseURL
	if cfg.Route != nil {
		base = cfg.Route("/v1/chat/completions", body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	sent := time.Now()
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	sse := loadgen.NewSSEReader(resp.Body, func() time.Duration { return time.Since(sent) })
	var ttft time.Duration
	var answer strings.Builder
	for {
		ev, err := sse.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, "", err
		}
		if ev.Keepalive || bytes.Equal(bytes.TrimSpace(ev.Data), []byte("[DONE]")) {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(ev.Data, &chunk) != nil || len(chunk.Choices) == 0 {
			continue
		}
		if c := chunk.Choices[0].Delta.Content; c != "" {
			if ttft == 0 {
				ttft = ev.At
			}
			answer.WriteString(c)
		}
	}
	if ttft == 0 {
		return 0, "", errors.New("no content in the stream")
	}
	return ttft, answer.String(), nil
}
