package vllm

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 13 item 7: an aborted multi-prompt completion is charged the sum of
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

// Issue 13 item 8: a stream that ended with [DONE] but carried no usage
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	assert.False(t, closedIdle(errors.New("EOF")))
	assert.True(t, closedIdle(errors.New(`Post "x": http: server closed idle connection`)))
}
