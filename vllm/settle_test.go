package vllm

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An aborted multi-prompt completion is charged the sum of
// its prompts' prompt_tokens, each as its own choices reported it (vLLM's
// continuous usage carries the choice's prompt's count), not the last
// chunk's.
func TestSettleSumsPromptTokensOverPrompts(t *testing.T) {
	sse := `data: {"choices":[{"index":0,"text":"a","finish_reason":null}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}

data: {"choices":[{"index":2,"text":"b","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}

`
	s := streamOf(sse)
	_, err := drain(t, s)
	require.ErrorIs(t, err, ErrStreamCut)
	// n=2, prompts of 10, 3 and (never reported) 7 admission tokens.
	u := s.SettleFor(Shape{N: 2, Inputs: []int{12, 5, 7}, Allowance: 1, Cap: 50})
	assert.Equal(t, 10+3+7, u.PromptTokens, "reported per prompt, admission count for the silent one")
	// choices 0 and 2 reported 1 and 2 (+1 each); 1, 3, 4, 5 nothing (+1 each).
	assert.Equal(t, (1+1)+(2+1)+4*1, u.CompletionTokens)
	assert.False(t, u.Final)
}

// A stream that ended with [DONE] but carried no usage
// does not settle its finished choices at 0 output: the cap is charged.
func TestSettleDoneWithoutUsageChargesCap(t *testing.T) {
	sse := `data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}

data: {"choices":[{"index":1,"delta":{},"finish_reason":"length"}]}

data: [DONE]

`
	s := streamOf(sse)
	_, err := drain(t, s)
	require.ErrorIs(t, err, io.EOF)
	u := s.SettleFor(Shape{N: 2, Inputs: []int{9}, Allowance: 1, Cap: 40})
	assert.Equal(t, 9, u.PromptTokens)
	assert.Equal(t, 80, u.CompletionTokens, "no usage evidence: the cap per choice")
}

// An error event before any chunk is the engine refusing the request
// (VLLM.md §1.5, errors after the headers): nothing ran, nothing is charged.
func TestSettleRefusedBeforeRunIsZero(t *testing.T) {
	s := streamOf(`data: {"error":{"message":"Requested sample logprobs of 21, which is greater than max allowed: 20","type":"BadRequestError","param":"logprobs","code":400}}

data: [DONE]

`)
	_, err := drain(t, s)
	require.ErrorIs(t, err, io.EOF)
	require.NotNil(t, s.Refused())
	assert.Equal(t, 400, s.Refused().Status)
	assert.Equal(t, "logprobs", s.Refused().Param)
	assert.Equal(t, Usage{}, s.SettleFor(Shape{N: 1, Inputs: []int{30}, Allowance: 1, Cap: 16}))

	// A 5xx after output is no refusal: the usage so far is charged.
	s = streamOf(`data: {"choices":[{"index":0,"text":"a","finish_reason":null}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}

data: {"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}

data: [DONE]

`)
	_, _ = drain(t, s)
	assert.Nil(t, s.Refused())
	assert.Equal(t, Usage{PromptTokens: 4, CompletionTokens: 2, Known: true, Choices: 1}, s.SettleFor(Shape{N: 1, Inputs: []int{30}, Allowance: 1, Cap: 16}))
}

// A non-streamed upstream request comes back as one whole event: its body
// passes through to the client and its usage is final.
func TestClientNonStreamedIsWhole(t *testing.T) {
	body := `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x","prompt_logprobs":[null]}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	defer srv.Close()
	// The header timeout that guards streams must not cut a long
	// non-streamed generation.
	c := NewClient(Config{ResponseHeaderTimeout: time.Nanosecond})
	s, err := c.Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{"prompt":"a","prompt_logprobs":1,"max_tokens":2}`), "")
	require.NoError(t, err)
	defer s.Close()
	a := NewAssembler(EndpointCompletions)
	ev, err := s.Next()
	require.NoError(t, err)
	assert.True(t, ev.Whole)
	require.NoError(t, a.Add(ev))
	_, err = s.Next()
	require.ErrorIs(t, err, io.EOF)
	got, err := a.Body()
	require.NoError(t, err)
	assert.Equal(t, body, string(got), "vLLM's own body, byte for byte")
	assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 2, Final: true, Known: true}, s.Usage())
	// Settled from the final usage, not the cap.
	assert.Equal(t, 2, s.SettleFor(Shape{N: 1, Inputs: []int{9}, Allowance: 1, Cap: 16}).CompletionTokens)
}

// A request written to a keep-alive connection the server had closed while
// idle never reached it; the client sends it again on a fresh connection
// instead of failing (uvicorn closes idle connections after 5s).
func TestClientRetriesOnServerClosedIdle(t *testing.T) {
	var served atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	var mu sync.Mutex
	var conns []net.Conn
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateIdle {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewClient(Config{IdleConnTimeout: time.Hour})
	send := func() error {
		s, err := c.Stream(context.Background(), srv.URL, "/v1/completions", []byte(`{"prompt":"a"}`), "")
		if err == nil {
			_, _ = s.Next()
			_ = s.Close()
		}
		return err
	}
	require.NoError(t, send())
	// The server closes the idle connection without the client's pool
	// having noticed yet: the next request is written to a dead socket.
	closeIdle := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, cn := range conns {
			_ = cn.Close()
		}
		conns = nil
	}
	for range 20 {
		closeIdle()
		require.NoError(t, send(), "a closed idle connection must not become an error")
	}
	assert.Equal(t, int32(21), served.Load(), "each request ran exactly once")
}

// Image parts add the configured per-part allowance to
// the bytes bound.
func TestMediaPartsAddAllowance(t *testing.T) {
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x/a.png"}},{"type":"input_audio","input_audio":{"data":"AAAA"}}]}]}`
	plain, err := Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`), CountOptions{})
	require.NoError(t, err)
	r, err := Parse(EndpointChat, []byte(body), CountOptions{MediaTokensPerPart: 1000})
	require.NoError(t, err)
	assert.True(t, r.HasMedia)
	assert.Equal(t, 2, r.MediaParts)
	assert.Equal(t, plain.InputTokens[0]+2000, r.InputTokens[0])
	def, err := Parse(EndpointChat, []byte(body), CountOptions{})
	require.NoError(t, err)
	assert.Equal(t, plain.InputTokens[0]+2*DefaultMediaTokensPerPart, def.InputTokens[0])
}

// A cap lowered by Sluice never goes below the client's
// min_tokens; the request is refused instead (naming min_tokens).
func TestPlanRefusesCapBelowMinTokens(t *testing.T) {
	r, err := Parse(EndpointCompletions, []byte(`{"prompt":[1,2,3],"max_tokens":100,"min_tokens":50}`), CountOptions{})
	require.NoError(t, err)
	_, err = r.Plan(Limits{MaxModelLen: 1000, TenantMaxOutput: 40})
	var ie *InvalidRequestError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "min_tokens", ie.Param)
	require.ErrorIs(t, err, ErrInvalidRequest)
	p, err := r.Plan(Limits{MaxModelLen: 1000, TenantMaxOutput: 60})
	require.NoError(t, err)
	assert.Equal(t, 60, p.Cap)
	// The client's own cap below its min_tokens is vLLM's 400 to give.
	r, err = Parse(EndpointCompletions, []byte(`{"prompt":[1],"max_tokens":5,"min_tokens":9}`), CountOptions{})
	require.NoError(t, err)
	p, err = r.Plan(Limits{MaxModelLen: 1000})
	require.NoError(t, err)
	assert.Equal(t, 5, p.Cap)
}

// A cap cut from the bytes bound is flagged (the
// scheduler then counts exactly); a /tokenize count keeps the template
// margin free when Sluice injects the cap, but a client cap that fits the
// exact count is never refused for the margin.
func TestPlanBoundCutAndTokenizeMargin(t *testing.T) {
	r, err := Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"`+strings.Repeat("abcd ", 1000)+`"}]}`), CountOptions{})
	require.NoError(t, err)
	p, err := r.Plan(Limits{MaxModelLen: 8192})
	require.NoError(t, err)
	assert.True(t, p.BoundCut, "no client cap: the bound decided the cap")
	exact, err := r.WithTokenizedInput([]int{1007}, 64)
	require.NoError(t, err)
	p, err = exact.Plan(Limits{MaxModelLen: 8192})
	require.NoError(t, err)
	assert.False(t, p.BoundCut)
	assert.True(t, p.Default, "no limit below the context: vLLM's own default applies")
	assert.Equal(t, 8192-1007, p.Cap, "the hold covers all vLLM may generate")
	assert.Equal(t, 0, p.UpstreamCap())
	lowered := p
	lowered.Cap = 100 // a budget lowers it after planning
	assert.Equal(t, 100, lowered.UpstreamCap(), "a lowered cap is written upstream")
	// A tenant limit inside the margin: Sluice injects, keeping the margin.
	p, err = exact.Plan(Limits{MaxModelLen: 8192, TenantMaxOutput: 8192 - 1007 - 10})
	require.NoError(t, err)
	assert.False(t, p.Default)
	assert.Equal(t, 8192-1007-64, p.Cap)
	assert.Equal(t, p.Cap, p.UpstreamCap())
	r, err = Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"x"}],"max_tokens":7160}`), CountOptions{})
	require.NoError(t, err)
	exact, err = r.WithTokenizedInput([]int{1007}, 64)
	require.NoError(t, err)
	p, err = exact.Plan(Limits{MaxModelLen: 8192})
	require.NoError(t, err, "1007 + 7160 fits 8192 exactly: vLLM decides")
	assert.Equal(t, 7160, p.Cap)
	_, err = exact.Plan(Limits{MaxModelLen: 8000})
	assert.ErrorIs(t, err, ErrContextLength)
}

// TestTokenizeContinueFinalMessage: /tokenize gets add_generation_prompt
// false with continue_final_message (it refuses both set).
func TestTokenizeContinueFinalMessage(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		_, _ = io.WriteString(w, `{"count":5,"max_model_len":100}`)
	}))
	defer srv.Close()
	r, err := Parse(EndpointChat, []byte(`{"messages":[{"role":"assistant","content":"Once"}],"continue_final_message":true}`), CountOptions{})
	require.NoError(t, err)
	counts, _, err := NewClient(Config{}).Tokenize(t.Context(), srv.URL, "m", r)
	require.NoError(t, err)
	assert.Equal(t, []int{5}, counts)
	assert.Equal(t, false, got["add_generation_prompt"])
	assert.Equal(t, true, got["continue_final_message"])
}

// An aborted stream is charged its last cumulative usage plus the
// allowance (one stream interval) per unfinished choice. A step of 8
// between two usage chunks at interval 1 is vLLM's API server catching up
// with merged outputs, not an interval of 8: it does not raise the charge.
func TestSettleAllowanceIsOneInterval(t *testing.T) {
	s := streamOf(`data: {"choices":[{"index":0,"text":"a","finish_reason":null}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}

data: {"choices":[{"index":0,"text":"b c d e f g h i","finish_reason":null}],"usage":{"prompt_tokens":4,"completion_tokens":9,"total_tokens":13}}

`)
	_, err := drain(t, s)
	require.ErrorIs(t, err, ErrStreamCut)
	u := s.SettleFor(Shape{N: 1, Inputs: []int{4}, Allowance: 1, Cap: 100})
	assert.Equal(t, 9+1, u.CompletionTokens, "one token past the last usage at interval 1")
	assert.Equal(t, 9+16, s.SettleFor(Shape{N: 1, Inputs: []int{4}, Allowance: 16, Cap: 100}).CompletionTokens, "one interval of 16")
	assert.Equal(t, 12, s.SettleFor(Shape{N: 1, Inputs: []int{4}, Allowance: 16, Cap: 12}).CompletionTokens, "capped")
}

// Plan.Default: a chat request without a cap keeps vLLM's own default, so
// Rewrite writes no cap at all.
func TestRewriteKeepsVLLMDefaultCap(t *testing.T) {
	r, err := Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`), CountOptions{})
	require.NoError(t, err)
	assert.Equal(t, `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, string(r.Rewrite(nil, 0)))
	r, err = Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"hi"}]}`), CountOptions{})
	require.NoError(t, err)
	assert.Equal(t, `{"messages":[{"role":"user","content":"hi"}]}`, string(r.Rewrite(nil, 0)))
}

// A streaming client that did not ask for usage gets
// vLLM's system_fingerprint on each choice's finish chunk, as vLLM writes it
// when no usage chunk follows; the usage chunk itself stays stripped.
func TestShaperRestoresFingerprint(t *testing.T) {
	in := `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}

data: {"id":"c","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}

data: {"id":"c","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4},"system_fingerprint":"vllm-x"}

data: [DONE]

`
	run := func(body string) string {
		r, err := Parse(EndpointChat, []byte(body), CountOptions{})
		require.NoError(t, err)
		sh := NewShaper(r)
		s := streamOf(in)
		var out []byte
		for {
			ev, err := s.Next()
			if err != nil {
				break
			}
			out, _ = sh.Shape(out, ev)
		}
		return string(out)
	}
	got := run(`{"messages":[{"role":"user","content":"x"}],"stream":true}`)
	assert.Equal(t, `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}

data: {"id":"c","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"system_fingerprint":"vllm-x"}

data: [DONE]

`, got)
	got = run(`{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`)
	assert.Contains(t, got, `"finish_reason":"stop"}]}`, "with usage the finish chunk is unchanged")
	assert.Contains(t, got, `"system_fingerprint":"vllm-x"}`, "and the usage chunk carries it")
}
