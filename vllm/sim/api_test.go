package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fullResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usageJSON `json:"usage"`
}

func tokenizeCount(t *testing.T, url, body string) int {
	t.Helper()
	resp, b := post(t, url+"/tokenize", body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	var tr struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	require.NoError(t, json.Unmarshal(b, &tr))
	assert.Len(t, tr.Tokens, tr.Count)
	return tr.Count
}

func TestNonStreamUsage(t *testing.T) {
	_, url := startReplica(t, fastConfig())
	tests := []struct {
		name, path, body string
		choices          int
	}{
		{"chat", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"what is a tokenizer really"}],"max_tokens":30}`, 1},
		{"chat n=3", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}],"max_completion_tokens":20,"n":3}`, 3},
		{"completions text", "/v1/completions", `{"model":"sim-model","prompt":"supercalifragilistic words here","max_tokens":25,"n":2}`, 2},
		{"completions token ids", "/v1/completions", `{"model":"sim-model","prompt":[1,2,3,4,5,6,7],"max_tokens":9,"ignore_eos":true}`, 1},
		{"completions list of prompts", "/v1/completions", `{"model":"sim-model","prompt":["one two","three four five"],"max_tokens":12,"n":2}`, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := post(t, url+tt.path, tt.body)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			var fr fullResponse
			require.NoError(t, json.Unmarshal(b, &fr))
			require.Len(t, fr.Choices, tt.choices)
			completion := 0
			for i, c := range fr.Choices {
				assert.Equal(t, i, c.Index)
				text := c.Text
				if strings.Contains(tt.path, "chat") {
					assert.Equal(t, "assistant", c.Message.Role)
					text = c.Message.Content
				}
				// output words are one token each: the text re-tokenizes to the count.
				completion += countText(text)
				assert.Contains(t, []string{"stop", "length"}, c.FinishReason)
			}
			assert.Equal(t, completion, fr.Usage.CompletionTokens, "completion tokens equal tokens generated")
			assert.Equal(t, fr.Usage.PromptTokens+fr.Usage.CompletionTokens, fr.Usage.TotalTokens)
		})
	}
	t.Run("tokens generated match the engine", func(t *testing.T) {
		r, url := startReplica(t, fastConfig())
		total := 0
		for i := range 5 {
			_, b := post(t, url+"/v1/completions", fmt.Sprintf(`{"model":"sim-model","prompt":"p %d","max_tokens":40,"n":3}`, i))
			var fr fullResponse
			require.NoError(t, json.Unmarshal(b, &fr))
			total += fr.Usage.CompletionTokens
		}
		assert.Equal(t, int64(total), r.Stats().GenerationTokens)
	})
}

func TestTokenizeMatchesUsage(t *testing.T) {
	_, url := startReplica(t, fastConfig())
	tests := []struct {
		name, tokenize, generate string
	}{
		{"text", `{"model":"sim-model","prompt":"Hello, wonderful wörld — ok\tnew\nline"}`,
			`{"model":"sim-model","prompt":"Hello, wonderful wörld — ok\tnew\nline","max_tokens":3}`},
		{"token ids", `{"prompt":[5,6,7,8,9,10]}`, `{"model":"sim-model","prompt":[5,6,7,8,9,10],"max_tokens":3}`},
		{"chat", `{"model":"sim-model","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarise everything"}]}`,
			`{"model":"sim-model","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarise everything"}],"max_tokens":3}`},
		{"chat with tools", `{"model":"sim-model","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]}`,
			`{"model":"sim-model","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"max_tokens":3}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			count := tokenizeCount(t, url, tt.tokenize)
			path := "/v1/completions"
			if strings.Contains(tt.generate, "messages") {
				path = "/v1/chat/completions"
			}
			resp, b := post(t, url+path, tt.generate)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			var fr fullResponse
			require.NoError(t, json.Unmarshal(b, &fr))
			assert.Equal(t, count, fr.Usage.PromptTokens)
		})
	}
	t.Run("known counts", func(t *testing.T) {
		assert.Equal(t, 5, tokenizeCount(t, url, `{"prompt":"abcdefgh ij klmnopq"}`)) // abcd efgh ij klmn opq
		assert.Equal(t, 2*msgOverheadTokens+genPromptTokens+3,
			tokenizeCount(t, url, `{"messages":[{"role":"system","content":"a"},{"role":"user","content":"b c"}]}`))
		assert.Equal(t, msgOverheadTokens+1,
			tokenizeCount(t, url, `{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":false}`))
	})
}

func TestStreamUsageShapes(t *testing.T) {
	_, url := startReplica(t, fastConfig())
	type want struct {
		usageChunk, continuous bool
	}
	tests := []struct {
		name, path, body string
		want
		choices int
	}{
		{"chat no options", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":12,"stream":true}`, want{false, false}, 1},
		{"chat include_usage default", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":12,"stream":true,"stream_options":{}}`, want{true, false}, 1},
		{"chat continuous n=2", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":12,"n":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, want{true, true}, 2},
		{"completions continuous only", "/v1/completions", `{"model":"sim-model","prompt":"x y z","max_tokens":12,"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`, want{false, true}, 1},
		{"completions include_usage n=3", "/v1/completions", `{"model":"sim-model","prompt":"x y z","max_tokens":30,"n":3,"stream":true,"stream_options":{"include_usage":true}}`, want{true, false}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := post(t, url+tt.path, tt.body)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
			ev := sseEvents(t, b)
			require.NotEmpty(t, ev)
			assert.Equal(t, "[DONE]", ev[len(ev)-1], "ends with [DONE]")
			ev = ev[:len(ev)-1]
			var final *usageJSON
			if tt.usageChunk {
				last := decodeChunk(t, ev[len(ev)-1])
				require.Empty(t, last.Choices, "usage chunk has choices: []")
				require.NotNil(t, last.Usage)
				final = last.Usage
				ev = ev[:len(ev)-1]
			}
			lastCum := map[int]int{}
			tokens := map[int]int{}
			finishes := 0
			for _, e := range ev {
				c := decodeChunk(t, e)
				require.Len(t, c.Choices, 1)
				ch := c.Choices[0]
				text := ""
				if ch.Delta != nil && ch.Delta.Content != nil {
					text = *ch.Delta.Content
				}
				if ch.Text != nil {
					text = *ch.Text
				}
				tokens[ch.Index] += countText(text)
				if ch.FinishReason != nil {
					finishes++
				}
				if tt.continuous {
					require.NotNil(t, c.Usage, "continuous usage on every chunk")
					assert.Equal(t, tokens[ch.Index], c.Usage.CompletionTokens, "cumulative per choice")
					assert.GreaterOrEqual(t, c.Usage.CompletionTokens, lastCum[ch.Index])
					lastCum[ch.Index] = c.Usage.CompletionTokens
				} else {
					assert.Nil(t, c.Usage)
				}
			}
			assert.Equal(t, tt.choices, finishes, "one finish_reason per choice")
			assert.Len(t, tokens, tt.choices)
			if final != nil {
				sum := 0
				for _, n := range tokens {
					sum += n
				}
				assert.Equal(t, sum, final.CompletionTokens, "usage sums the choices")
				assert.Equal(t, final.PromptTokens+final.CompletionTokens, final.TotalTokens)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 100
	r, url := startReplica(t, cfg)
	tests := []struct {
		name, path, body string
		status           int
		typ, param       string
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, 400, "BadRequestError", ""},
		{"trailing garbage", "/v1/completions", `{"model":"sim-model","prompt":"a"} x`, 400, "BadRequestError", ""},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "model"},
		{"prompt + max_tokens > max_model_len", "/v1/completions", `{"model":"sim-model","prompt":` + tokenIDPrompt(60) + `,"max_tokens":41}`, 400, "BadRequestError", "input_tokens"},
		{"prompt alone too long", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("w ", 100) + `"}]}`, 400, "BadRequestError", "input_tokens"},
		{"logprobs above max_logprobs", "/v1/completions", `{"model":"sim-model","prompt":"a","logprobs":21}`, 400, "BadRequestError", "logprobs"},
		{"prompt_logprobs above max_logprobs", "/v1/completions", `{"model":"sim-model","prompt":"a","prompt_logprobs":21}`, 400, "BadRequestError", "prompt_logprobs"},
		{"prompt_logprobs with stream", "/v1/completions", `{"model":"sim-model","prompt":"a","prompt_logprobs":1,"stream":true}`, 400, "BadRequestError", "prompt_logprobs"},
		{"beam search with stream", "/v1/completions", `{"model":"sim-model","prompt":"a","use_beam_search":true,"stream":true}`, 400, "BadRequestError", ""},
		{"top_logprobs without logprobs", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, 400, "BadRequestError", "top_logprobs"},
		{"out-of-vocabulary token id", "/v1/completions", `{"model":"sim-model","prompt":[1,2,40000]}`, 400, "BadRequestError", ""},
		{"json_schema without schema", "/v1/completions", `{"model":"sim-model","prompt":"a","response_format":{"type":"json_schema"}}`, 400, "BadRequestError", "response_format"},
		{"invalid json schema", "/v1/completions", `{"model":"sim-model","prompt":"a","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"nope"}}}}`, 400, "BadRequestError", ""},
		{"prompt exactly max_model_len", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("w ", 93) + `"}]}`, 400, "BadRequestError", ""},
		{"bad stream_interval", "/v1/completions", `{"model":"sim-model","prompt":"a","stream_interval":0}`, 400, "BadRequestError", "stream_interval"},
		{"stream_options without stream", "/v1/completions", `{"model":"sim-model","prompt":"a","stream_options":{}}`, 400, "BadRequestError", "stream_options"},
		{"max_tokens zero", "/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":0}`, 400, "BadRequestError", "max_tokens"},
		{"n zero", "/v1/completions", `{"model":"sim-model","prompt":"a","n":0}`, 400, "BadRequestError", "n"},
		{"no prompt", "/v1/completions", `{"model":"sim-model"}`, 400, "BadRequestError", "prompt"},
		{"bad messages", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":5}]}`, 400, "BadRequestError", "messages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := post(t, url+tt.path, tt.body)
			assert.Equal(t, tt.status, resp.StatusCode)
			var eb struct {
				Error errorBodyJSON `json:"error"`
			}
			require.NoError(t, json.Unmarshal(b, &eb), "%s", b)
			assert.Equal(t, tt.typ, eb.Error.Type)
			assert.Equal(t, tt.status, eb.Error.Code)
			assert.NotEmpty(t, eb.Error.Message)
			if tt.param == "" {
				assert.Nil(t, eb.Error.Param)
			} else if assert.NotNil(t, eb.Error.Param) {
				assert.Equal(t, tt.param, *eb.Error.Param)
			}
		})
	}
	st := r.Stats()
	assert.Equal(t, int64(len(tests)), st.Received)
	assert.Equal(t, int64(len(tests)), st.Rejected)
	assert.Equal(t, int64(0), st.Admitted, "validation precedes queueing")
	t.Run("exactly at max_model_len is fine", func(t *testing.T) {
		resp, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":`+tokenIDPrompt(60)+`,"max_tokens":40,"ignore_eos":true}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Contains(t, string(b), `"completion_tokens":40,`)
	})
	t.Run("chat without a cap gets the remaining context", func(t *testing.T) {
		resp, b := post(t, url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"ignore_eos":true}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		prompt := msgOverheadTokens + 1 + genPromptTokens
		assert.Contains(t, string(b), fmt.Sprintf(`"completion_tokens":%d,`, 100-prompt))
	})
	t.Run("completions default cap is 16", func(t *testing.T) {
		_, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"x","ignore_eos":true}`)
		assert.Contains(t, string(b), `"completion_tokens":16,`)
	})
}

func TestModelsAndHealth(t *testing.T) {
	cfg := fastConfig()
	cfg.Model = "org/m-7b"
	cfg.MaxModelLen = 2048
	_, url := startReplica(t, cfg)
	resp, err := http.Get(url + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	var ml struct {
		Data []struct {
			ID          string `json:"id"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ml))
	require.Len(t, ml.Data, 1)
	assert.Equal(t, "org/m-7b", ml.Data[0].ID)
	assert.Equal(t, "vllm", ml.Data[0].OwnedBy)
	assert.Equal(t, 2048, ml.Data[0].MaxModelLen)
	h, err := http.Get(url + "/health")
	require.NoError(t, err)
	h.Body.Close()
	assert.Equal(t, http.StatusOK, h.StatusCode)
}

func TestDeterminism(t *testing.T) {
	body := `{"model":"sim-model","prompt":"same prompt","max_tokens":50,"n":2}`
	run := func(seed int64, replica int, id string) string {
		cfg := fastConfig()
		cfg.Seed = seed
		cfg.ReplicaIndex = replica
		_, url := startReplica(t, cfg)
		_, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"warm up"}`)
		require.NotEmpty(t, b)
		var hdr []string
		if id != "" {
			hdr = []string{"X-Request-Id", id}
		}
		_, b = post(t, url+"/v1/completions", body, hdr...)
		var fr fullResponse
		require.NoError(t, json.Unmarshal(b, &fr))
		return fr.Choices[0].Text + "|" + fr.Choices[1].Text
	}
	a := run(7, 0, "req-1")
	assert.Equal(t, a, run(7, 0, "req-1"), "same seed, replica and id")
	assert.NotEqual(t, a, run(8, 0, "req-1"), "seed changes the stream")
	assert.NotEqual(t, a, run(7, 1, "req-1"), "replica changes the stream")
	assert.NotEqual(t, a, run(7, 0, "req-2"), "id changes the stream")
	noID := run(7, 0, "")
	assert.Equal(t, noID, run(7, 0, ""), "body hash keys requests without an id")
}

func TestRequestIDShapesID(t *testing.T) {
	_, url := startReplica(t, fastConfig())
	_, b := post(t, url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":2}`, "X-Request-Id", "abc-123")
	var fr fullResponse
	require.NoError(t, json.Unmarshal(b, &fr))
	assert.Equal(t, "chatcmpl-abc-123", fr.ID)
}

func TestFaults(t *testing.T) {
	t.Run("error before the stream", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Faults.ErrorRate = 1
		cfg.Faults.ErrorStatus = 503
		r, url := startReplica(t, cfg)
		resp, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"x","stream":true}`)
		assert.Equal(t, 503, resp.StatusCode)
		assert.Contains(t, string(b), `"code":503`)
		assert.Equal(t, int64(0), r.Stats().Admitted)
	})
	t.Run("drop mid-stream", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Faults.DropRate = 1
		r, url := startReplica(t, cfg)
		req, err := http.NewRequest(http.MethodPost, url+"/v1/completions",
			strings.NewReader(`{"model":"sim-model","prompt":"x","max_tokens":100,"ignore_eos":true,"stream":true,"stream_options":{}}`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "connection cut without the chunk terminator")
		assert.NotContains(t, string(b), "[DONE]")
		assert.NotContains(t, string(b), `"choices":[]`)
		require.Eventually(t, func() bool { return r.Stats().Aborted == 1 }, 5*time.Second, time.Millisecond)
		assert.Less(t, r.Stats().GenerationTokens, int64(100))
	})
	t.Run("error event mid-stream", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Faults.StreamErrorRate = 1
		_, url := startReplica(t, cfg)
		resp, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":100,"ignore_eos":true,"stream":true}`)
		assert.Equal(t, 200, resp.StatusCode)
		ev := sseEvents(t, b)
		require.GreaterOrEqual(t, len(ev), 3)
		assert.Equal(t, "[DONE]", ev[len(ev)-1])
		c := decodeChunk(t, ev[len(ev)-2])
		require.NotNil(t, c.Error)
		assert.Equal(t, 500, c.Error.Code)
	})
	t.Run("dead after", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Faults.DeadAfter = time.Millisecond
		r, url := startReplica(t, cfg)
		require.Eventually(t, func() bool {
			h, err := http.Get(url + "/health")
			if err != nil {
				return false
			}
			h.Body.Close()
			return h.StatusCode == http.StatusServiceUnavailable
		}, 5*time.Second, time.Millisecond)
		resp, _ := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"x"}`)
		assert.Equal(t, 500, resp.StatusCode)
		assert.Equal(t, int64(1), r.Stats().Rejected)
	})
	t.Run("queue limit", func(t *testing.T) {
		cfg := fastConfig()
		cfg.MaxNumSeqs = 1
		cfg.MaxNumQueuedReqs = 1
		_, url := startReplica(t, cfg)
		resp, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"x","n":3}`)
		assert.Equal(t, 503, resp.StatusCode, "%s", b)
	})
}

func TestStartupDelay(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.StartupDelay = 100 * time.Millisecond
	start := time.Now()
	_, url := startReplica(t, cfg)
	h, err := http.Get(url + "/health")
	require.NoError(t, err)
	h.Body.Close()
	assert.Equal(t, http.StatusOK, h.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "served only after the delay")
}

// TestLateErrorsStreamed checks the errors vLLM raises when the engine adds
// a request: a streamed request has its 200 headers already and gets an SSE
// error event, then [DONE], nothing else (completion/serving.py).
func TestLateErrorsStreamed(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 100
	cfg.MaxNumQueuedReqs = 1
	r, url := startReplica(t, cfg)
	tests := []struct {
		name, path, body, param, msg string
	}{
		{"logprobs", "/v1/completions", `{"model":"sim-model","prompt":"a","logprobs":21,"stream":true}`, "logprobs",
			"Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"},
		{"chat top_logprobs", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":30,"stream":true}`, "logprobs",
			"Requested sample logprobs of 30, which is greater than max allowed: 20 (parameter=logprobs, value=30)"},
		{"oov", "/v1/completions", `{"model":"sim-model","prompt":[5,32000],"stream":true}`, "", "Token id 32000 is out of vocabulary"},
		{"schema", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[1]}},"stream":true}`, "",
			"Error in structured output: the JSON schema is invalid"},
		{"exactly max_model_len", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("w ", 93) + `"}],"stream":true}`, "",
			"The decoder prompt (length 100) plus the number of requested output tokens (at least 1) is longer than the maximum model length of 100. Make sure that `max_model_len` is no smaller than the number of text tokens (prompt + requested output tokens)."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := post(t, url+tt.path, tt.body)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			ev := sseEvents(t, b)
			require.Len(t, ev, 2, "%s", b)
			assert.Equal(t, "[DONE]", ev[1])
			var eb struct {
				Error errorBodyJSON `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(ev[0]), &eb))
			assert.Equal(t, 400, eb.Error.Code)
			assert.Equal(t, "BadRequestError", eb.Error.Type)
			assert.Equal(t, tt.msg, eb.Error.Message)
			if tt.param == "" {
				assert.Nil(t, eb.Error.Param)
			} else if assert.NotNil(t, eb.Error.Param) {
				assert.Equal(t, tt.param, *eb.Error.Param)
			}
		})
	}
	st := r.Stats()
	assert.Equal(t, int64(len(tests)), st.Rejected)
	assert.Equal(t, int64(0), st.Admitted, "the engine never ran them")
	assert.Equal(t, int64(0), st.PromptTokens)
}

// TestPriorityIgnoredUnderFCFS: vLLM v1's FCFS queue ignores priority.
func TestPriorityIgnoredUnderFCFS(t *testing.T) {
	_, url := startReplica(t, fastConfig())
	resp, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"a","priority":7,"max_tokens":3}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
}

// TestQueueLimitCountsRunning: --max-num-queued-reqs counts running
// requests too; a streamed request is refused after its headers.
func TestQueueLimitCountsRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.MaxNumQueuedReqs = 1
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		first := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":50,"ignore_eos":true,"stream":true}`, "one")
		for b.r.Stats().Running == 0 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		second := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"b","max_tokens":5,"stream":true}`, "two")
		third := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"b","max_tokens":5}`, "three")
		synctest.Wait()
		for len(first.events()) == 0 || !strings.Contains(first.events()[len(first.events())-1].data, "[DONE]") {
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		b.stop()
		assert.Equal(t, 200, second.status)
		assert.Contains(t, string(second.body), `"code":503`)
		assert.True(t, strings.HasSuffix(string(second.body), "data: [DONE]\n\n"))
		assert.Equal(t, 503, third.status)
		assert.Equal(t, int64(1), b.r.Stats().Admitted)
	})
}

// TestRoleChunkWithFirstToken: the chat role chunk goes out with the first
// token, after queueing and prefill, not with the headers
// (chat_completion/serving.py sends it on the first engine output).
func TestRoleChunkWithFirstToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.PrefillTPS = 10000
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		start := time.Now()
		body := `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("word ", 993) + `"}],"max_tokens":3,"ignore_eos":true,"stream":true}`
		rec := b.do(t.Context(), "/v1/chat/completions", body, "role")
		for len(rec.events()) < 2 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		ev := rec.events()
		assert.Empty(t, ev[0].data, "headers flushed first, alone")
		assert.Equal(t, time.Duration(0), ev[0].at.Sub(start))
		require.Contains(t, ev[1].data, `"role":"assistant"`)
		// prompt 1000 tokens at 10000/s = 100ms, plus the 10ms step.
		assert.Equal(t, 110*time.Millisecond, ev[1].at.Sub(start), "role chunk at the first token")
		assert.Contains(t, ev[1].data, `"content":"`, "first token in the same flush")
		b.stop()
	})
}

// TestChunkedPrefillAdmitsFirstChunk: with a step budget, a prompt larger
// than the free KV is admitted once its first chunk fits (vLLM v1), where
// whole-prompt admission would keep it waiting.
func TestChunkedPrefillAdmitsFirstChunk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.KVTokens = 1536 // 96 blocks
		cfg.MaxModelLen = 1024
		cfg.MaxNumBatchedTokens = 256
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		hold := b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":`+tokenIDPrompt(1000)+`,"max_tokens":20,"ignore_eos":true,"stream":true}`, "hold")
		for len(tokenEvents(t, hold)) < 1 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		// 63 blocks held, 33 free: the next 1000-token prompt does not fit
		// whole, its first 256-token chunk does.
		b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":`+tokenIDPrompt(1000)+`,"max_tokens":4,"ignore_eos":true,"stream":true}`, "next")
		time.Sleep(15 * time.Millisecond)
		synctest.Wait()
		st := b.r.Stats()
		assert.Equal(t, int64(2), st.Running, "admitted on its first chunk")
		assert.Equal(t, int64(0), st.Waiting)
		for b.r.Stats().FinishedSeqs < 2 {
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		assert.Equal(t, int64(24), b.r.Stats().GenerationTokens)
		b.stop()
	})
}
