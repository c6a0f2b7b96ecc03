package vllm

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCounts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ep        Endpoint
		body      string
		wantIn    []int
		wantExact bool
		wantMedia bool
	}{
		{
			name: "chat text and media parts",
			ep:   EndpointChat,
			body: `{"model":"m","messages":[{"role":"system","content":"You are terse."},` +
				`{"role":"user","content":[{"type":"text","text":"héllo"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
			// 64 per request + (6+14+8) + (4+6+8) + one media part
			wantIn:    []int{110 + DefaultMediaTokensPerPart},
			wantMedia: true,
		},
		{
			name: "chat escapes decoded",
			ep:   EndpointChat,
			body: `{"messages":[{"role":"user","content":"a\nb\u00e9\ud83d\ude00"}]}`,
			// 64 + 4 + 9 + 8
			wantIn: []int{85},
		},
		{
			name: "chat null content and tools",
			ep:   EndpointChat,
			body: `{"messages":[{"role":"assistant","content":null}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`,
			// 64 + 9 + 8 + 129 (tools re-indented with 4 spaces)
			wantIn: []int{210},
		},
		{
			name:   "completions string",
			ep:     EndpointCompletions,
			body:   `{"prompt":"hello world"}`,
			wantIn: []int{15},
		},
		{
			name:   "completions list of strings",
			ep:     EndpointCompletions,
			body:   `{"prompt":["ab","cde"]}`,
			wantIn: []int{6, 7},
		},
		{
			name:      "completions token ids",
			ep:        EndpointCompletions,
			body:      `{"prompt":[1,2,3]}`,
			wantIn:    []int{3},
			wantExact: true,
		},
		{
			name:      "completions list of token id lists",
			ep:        EndpointCompletions,
			body:      `{"prompt":[[1,2],[3]]}`,
			wantIn:    []int{2, 1},
			wantExact: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse(tt.ep, []byte(tt.body), CountOptions{})
			require.NoError(t, err)
			assert.Equal(t, tt.wantIn, r.InputTokens)
			assert.Equal(t, tt.wantExact, r.InputExact)
			assert.Equal(t, tt.wantMedia, r.HasMedia)
		})
	}
}

func TestParseFields(t *testing.T) {
	t.Parallel()
	body := `{"model":"llama","stream":true,"stream_options":{"continuous_usage_stats":true},"n":3,` +
		`"max_tokens":9,"max_completion_tokens":40,"ignore_eos":true,"min_tokens":2,"priority":-1,` +
		`"messages":[{"role":"user","content":"x"}]}`
	r, err := Parse(EndpointChat, []byte(body), CountOptions{TemplateTokensPerMessage: -1, TemplateTokensPerRequest: 1})
	require.NoError(t, err)
	assert.Equal(t, "llama", r.Model)
	assert.True(t, r.Stream)
	assert.True(t, r.HasStreamOptions)
	assert.True(t, r.IncludeUsage, "include_usage defaults to true once stream_options is present")
	assert.True(t, r.ContinuousUsage)
	assert.Equal(t, 3, r.N)
	assert.Equal(t, 40, r.MaxTokens, "max_completion_tokens wins over max_tokens")
	assert.True(t, r.IgnoreEOS)
	assert.Equal(t, 2, r.MinTokens)
	assert.Equal(t, -1, r.Priority)
	assert.Equal(t, []int{1 + 4 + 1}, r.InputTokens)

	r, err = Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`), CountOptions{})
	require.NoError(t, err)
	assert.False(t, r.IncludeUsage)
	assert.False(t, r.ContinuousUsage, "continuous usage needs include_usage")

	r, err = Parse(EndpointCompletions, []byte(`{"prompt":"x","max_completion_tokens":40,"max_tokens":7}`), CountOptions{})
	require.NoError(t, err)
	assert.Equal(t, 7, r.MaxTokens, "completions only know max_tokens")
	assert.False(t, r.HasStreamOptions)
	assert.False(t, r.IncludeUsage)
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ep        Endpoint
		body      string
		wantParam string
	}{
		{"not json", EndpointChat, `{"messages":`, ""},
		{"not object", EndpointChat, `[1]`, ""},
		{"model type", EndpointChat, `{"model":1,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{"stream type", EndpointChat, `{"stream":"yes","messages":[{"role":"user","content":"x"}]}`, "stream"},
		{"stream_options type", EndpointChat, `{"stream_options":true,"messages":[]}`, "stream_options"},
		{"include_usage type", EndpointChat, `{"stream_options":{"include_usage":1},"messages":[]}`, "stream_options.include_usage"},
		{"n zero", EndpointChat, `{"n":0,"messages":[{"role":"user","content":"x"}]}`, "n"},
		{"n float", EndpointChat, `{"n":1.5,"messages":[{"role":"user","content":"x"}]}`, "n"},
		{"max_tokens string", EndpointCompletions, `{"prompt":"x","max_tokens":"5"}`, "max_tokens"},
		{"max_completion_tokens zero", EndpointChat, `{"max_completion_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_completion_tokens"},
		{"max_tokens type checked beside max_completion_tokens", EndpointChat, `{"max_completion_tokens":3,"max_tokens":[],"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"messages missing", EndpointChat, `{"model":"m"}`, "messages"},
		{"messages type", EndpointChat, `{"messages":{}}`, "messages"},
		{"messages empty", EndpointChat, `{"messages":[]}`, "messages"},
		{"message type", EndpointChat, `{"messages":["hi"]}`, "messages[0]"},
		{"content type", EndpointChat, `{"messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{"part text type", EndpointChat, `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages[0].content[0].text"},
		{"part type missing", EndpointChat, `{"messages":[{"role":"user","content":[{"image_url":{}}]}]}`, "messages[0].content[0].type"},
		{"tools type", EndpointChat, `{"messages":[{"role":"user","content":"x"}],"tools":{}}`, "tools"},
		{"prompt missing", EndpointCompletions, `{"model":"m"}`, "prompt"},
		{"prompt type", EndpointCompletions, `{"prompt":true}`, "prompt"},
		{"prompt empty list", EndpointCompletions, `{"prompt":[]}`, "prompt"},
		{"prompt mixed", EndpointCompletions, `{"prompt":["a",1]}`, "prompt[1]"},
		{"prompt bad token", EndpointCompletions, `{"prompt":[[1,"a"]]}`, "prompt[0][1]"},
		{"prompt empty ids", EndpointCompletions, `{"prompt":[[]]}`, "prompt[0]"},
		{"priority float", EndpointChat, `{"priority":0.5,"messages":[{"role":"user","content":"x"}]}`, "priority"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tt.ep, []byte(tt.body), CountOptions{})
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalidRequest)
			var ie *InvalidRequestError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, tt.wantParam, ie.Param, "err: %v", err)
		})
	}
}

func TestRewrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ep   Endpoint
		body string
		cap  int
		want string
	}{
		{
			name: "chat replaces stream and caps keeps the rest",
			ep:   EndpointChat,
			body: `{"model":"m", "stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0.5}`,
			cap:  7,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stream":true,` +
				`"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_completion_tokens":7,"max_tokens":7}`,
		},
		{
			name: "non-streamed stays non-streamed: only the caps change",
			ep:   EndpointChat,
			body: `{"model":"m", "stream":false,"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0.5}`,
			cap:  7,
			want: `{"model":"m", "stream":false,"messages":[{"role":"user","content":"hi"}],"temperature":0.5,"max_completion_tokens":7,"max_tokens":7}`,
		},
		{
			name: "non-streamed keeps a stream_options vLLM refuses",
			ep:   EndpointCompletions,
			body: `{"prompt":"x","stream_options":{"include_usage":true}}`,
			cap:  3,
			want: `{"prompt":"x","stream_options":{"include_usage":true},"max_tokens":3}`,
		},
		{
			name: "completions keeps max_completion_tokens and whitespace",
			ep:   EndpointCompletions,
			body: "{\n  \"model\": \"m\",\n  \"prompt\": \"x\",\n  \"stream\": true,\n  \"max_completion_tokens\": 3\n}\n",
			cap:  16,
			want: "{\n  \"model\": \"m\",\n  \"prompt\": \"x\",\"max_completion_tokens\": 3\n" +
				`,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":16}` + "\n",
		},
		{
			name: "first members dropped",
			ep:   EndpointChat,
			body: `{"stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`,
			cap:  1,
			want: `{"messages":[{"role":"user","content":"hi"}],"stream":true,` +
				`"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_completion_tokens":1,"max_tokens":1}`,
		},
		{
			name: "unknown fields byte for byte",
			ep:   EndpointCompletions,
			body: `{"prompt":[1,2],"extra_body":{"a":[1, 2 ,{"b":"\u00e9"}]},"max_tokens":null,"stream":true}`,
			cap:  4,
			want: `{"prompt":[1,2],"extra_body":{"a":[1, 2 ,{"b":"\u00e9"}]},"stream":true,` +
				`"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":4}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse(tt.ep, []byte(tt.body), CountOptions{})
			require.NoError(t, err)
			got := r.Rewrite(nil, tt.cap)
			assert.Equal(t, tt.want, string(got))
			assert.True(t, json.Valid(got))
		})
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	chat := func(extra string) string {
		return `{"messages":[{"role":"user","content":"x"}]` + extra + `}`
	}
	tests := []struct {
		name    string
		ep      Endpoint
		body    string
		exact   []int
		limits  Limits
		want    Plan
		wantErr error
	}{
		{
			name:   "chat default is remaining context (bound)",
			ep:     EndpointChat,
			body:   chat(""),
			limits: Limits{MaxModelLen: 4096},
			want:   Plan{Cap: 4096 - 77, Choices: 1, InputTokens: 77, OutputTokens: 4096 - 77, BoundCut: true},
		},
		{
			name:   "chat default min tenant",
			ep:     EndpointChat,
			body:   chat(""),
			limits: Limits{MaxModelLen: 4096, TenantMaxOutput: 1024},
			want:   Plan{Cap: 1024, Choices: 1, InputTokens: 77, OutputTokens: 1024},
		},
		{
			name:   "client cap min budget, n multiplies",
			ep:     EndpointChat,
			body:   chat(`,"max_tokens":500,"n":2`),
			limits: Limits{MaxModelLen: 4096, TenantMaxOutput: 1024, BudgetMaxOutput: 100},
			want:   Plan{Cap: 100, Choices: 2, InputTokens: 77, OutputTokens: 200},
		},
		{
			name:   "completions default 16 per prompt and choice",
			ep:     EndpointCompletions,
			body:   `{"prompt":["a","b"],"n":3}`,
			limits: Limits{},
			want:   Plan{Cap: 16, Choices: 6, InputTokens: 10, OutputTokens: 96},
		},
		{
			name:    "exact prompt plus client cap over context",
			ep:      EndpointChat,
			body:    chat(`,"max_completion_tokens":500`),
			exact:   []int{4000},
			limits:  Limits{MaxModelLen: 4096},
			wantErr: ErrContextLength,
		},
		{
			name:   "bound prompt plus client cap over context is not refused, but counted",
			ep:     EndpointCompletions,
			body:   `{"prompt":"` + string(make([]byte, 0)) + `abc","max_tokens":4095}`,
			limits: Limits{MaxModelLen: 4096},
			want:   Plan{Cap: 4095, Choices: 1, InputTokens: 7, OutputTokens: 4095, BoundOver: true},
		},
		{
			name:    "exact client cap over context is vLLM's 400 before the tenant's cap",
			ep:      EndpointChat,
			body:    chat(`,"max_tokens":5000`),
			exact:   []int{10},
			limits:  Limits{MaxModelLen: 4096, TenantMaxOutput: 1024, BudgetMaxOutput: 100},
			wantErr: ErrContextLength,
		},
		{
			name:   "bound prompt over context is counted",
			ep:     EndpointChat,
			body:   chat(`,"max_tokens":5`),
			limits: Limits{MaxModelLen: 64},
			want:   Plan{Cap: 5, Choices: 1, InputTokens: 77, OutputTokens: 5, BoundOver: true},
		},
		{
			name:    "exact prompt fills context",
			ep:      EndpointCompletions,
			body:    `{"prompt":[1,2,3,4]}`,
			limits:  Limits{MaxModelLen: 4},
			wantErr: ErrContextLength,
		},
		{
			name:   "tenant cap above the remaining context: vLLM default, hold = remaining",
			ep:     EndpointChat,
			body:   chat(""),
			exact:  []int{4000},
			limits: Limits{MaxModelLen: 4096, TenantMaxOutput: 1024},
			want:   Plan{Cap: 96, Choices: 1, InputTokens: 4000, OutputTokens: 96, Default: true, room: 96},
		},
		{
			name:    "no cap derivable",
			ep:      EndpointChat,
			body:    chat(""),
			limits:  Limits{},
			wantErr: ErrNoCap,
		},
		{
			name:   "tenant below client",
			ep:     EndpointChat,
			body:   chat(`,"max_tokens":2000`),
			limits: Limits{TenantMaxOutput: 1000},
			want:   Plan{Cap: 1000, Choices: 1, InputTokens: 77, OutputTokens: 1000},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse(tt.ep, []byte(tt.body), CountOptions{})
			require.NoError(t, err)
			if tt.exact != nil {
				r, err = r.WithExactInput(tt.exact)
				require.NoError(t, err)
			}
			got, err := r.Plan(tt.limits)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestWithExactInputCountMismatch(t *testing.T) {
	t.Parallel()
	r, err := Parse(EndpointCompletions, []byte(`{"prompt":["a","b"]}`), CountOptions{})
	require.NoError(t, err)
	_, err = r.WithExactInput([]int{1})
	require.Error(t, err)
	r2, err := r.WithExactInput([]int{3, 4})
	require.NoError(t, err)
	assert.Equal(t, []int{3, 4}, r2.InputTokens)
	assert.Equal(t, []int{5, 5}, r.InputTokens, "the original is unchanged")
}

func TestRewriteNeverForwardsTheClientsPriority(t *testing.T) {
	t.Parallel()
	r := mustParse(t, EndpointCompletions, `{"prompt":"x","priority":-100,"seed":1,"stream":true}`)
	assert.Equal(t, -100, r.Priority, "type-checked as vLLM would")
	got := r.Rewrite(nil, 16)
	assert.Equal(t, `{"prompt":"x","seed":1,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":16}`, string(got))
	got = r.RewriteWith(nil, 16, RewriteOptions{SetPriority: true, Priority: 2})
	assert.Equal(t, `{"prompt":"x","seed":1,"priority":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_tokens":16}`, string(got))
}
