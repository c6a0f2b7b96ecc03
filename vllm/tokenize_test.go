package vllm

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ep        Endpoint
		body      string
		counts    []int // answered in order
		wantSent  []string
		wantCount []int
		wantLen   int
	}{
		{
			name: "chat sends messages tools template and kwargs",
			ep:   EndpointChat,
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],` +
				`"chat_template_kwargs":{"enable_thinking":false},"temperature":1}`,
			counts: []int{42},
			wantSent: []string{`{"model":"served","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],` +
				`"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true,"continue_final_message":false,"add_special_tokens":false}`},
			wantCount: []int{42},
			wantLen:   4096,
		},
		{
			name:   "chat continue_final_message passes through",
			ep:     EndpointChat,
			body:   `{"messages":[{"role":"assistant","content":"x"}],"add_generation_prompt":false,"continue_final_message":true,"chat_template":"{{x}}"}`,
			counts: []int{5},
			wantSent: []string{`{"model":"served","messages":[{"role":"assistant","content":"x"}],"chat_template":"{{x}}",` +
				`"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":false}`},
			wantCount: []int{5},
			wantLen:   4096,
		},
		{
			name:   "completions list of prompts",
			ep:     EndpointCompletions,
			body:   `{"prompt":["a b","c"],"add_special_tokens":false}`,
			counts: []int{3, 1},
			wantSent: []string{
				`{"model":"served","prompt":"a b","add_special_tokens":false}`,
				`{"model":"served","prompt":"c","add_special_tokens":false}`,
			},
			wantCount: []int{3, 1},
			wantLen:   4096,
		},
		{
			name:      "token ids counted locally",
			ep:        EndpointCompletions,
			body:      `{"prompt":[[1,2,3],[4]]}`,
			wantCount: []int{3, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var sent []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				assert.Equal(t, "/tokenize", r.URL.Path)
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				i := len(sent)
				sent = append(sent, string(b))
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"count":`+strconv.Itoa(tt.counts[i])+`,"max_model_len":4096,"tokens":[],"token_strs":null}`)
			}))
			defer srv.Close()
			r := mustParse(t, tt.ep, tt.body)
			counts, maxLen, err := NewClient(Config{}).Tokenize(t.Context(), srv.URL, "served", r)
			require.NoError(t, err)
			assert.Equal(t, tt.wantCount, counts)
			assert.Equal(t, tt.wantLen, maxLen)
			assert.Equal(t, tt.wantSent, sent)
		})
	}
}

func TestTokenizeError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"Cannot set both","type":"BadRequestError","param":null,"code":400}}`)
	}))
	defer srv.Close()
	_, _, err := NewClient(Config{}).Tokenize(t.Context(), srv.URL, "m", mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"x"}]}`))
	var ue *UpstreamError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 400, ue.Status)
	assert.Equal(t, "BadRequestError", ue.Type)
}

func TestModels(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/v1/models", r.URL.Path)
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"llama","object":"model","created":1,"owned_by":"vllm","root":"/m","parent":null,"max_model_len":8192,"permission":[]},{"id":"lora","object":"model","owned_by":"vllm"}]}`)
	}))
	defer srv.Close()
	ms, err := NewClient(Config{}).Models(t.Context(), srv.URL+"/")
	require.NoError(t, err)
	assert.Equal(t, []Model{{ID: "llama", MaxModelLen: 8192}, {ID: "lora"}}, ms)
}

func TestTokenizeCompletionsDefaultAddsSpecialTokens(t *testing.T) {
	t.Parallel()
	var sent string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sent = string(b)
		_, _ = io.WriteString(w, `{"count":2,"max_model_len":128}`)
	}))
	defer srv.Close()
	counts, maxLen, err := NewClient(Config{}).Tokenize(t.Context(), srv.URL, "", mustParse(t, EndpointCompletions, `{"prompt":"hi"}`))
	require.NoError(t, err)
	assert.Equal(t, []int{2}, counts)
	assert.Equal(t, 128, maxLen)
	assert.Equal(t, `{"prompt":"hi","add_special_tokens":true}`, sent)
}
