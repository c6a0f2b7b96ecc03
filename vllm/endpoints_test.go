package vllm

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseOtherEndpoints(t *testing.T) {
	t.Parallel()
	cases := []struct {
		ep   Endpoint
		body string
		in   int
	}{
		{EndpointEmbeddings, `{"model":"m","input":[1,2,3,4,5]}`, 5},
		{EndpointEmbeddings, `{"model":"m","input":["ab","c"]}`, 3 + 2*DefaultSpecialTokensPerPrompt},
		{EndpointScore, `{"model":"m","text_1":"qq","text_2":["a","bb"]}`, 2*(2+2*DefaultSpecialTokensPerPrompt) + 3},
		{EndpointRerank, `{"query":"qq","documents":["a","bb"]}`, 2*(2+2*DefaultSpecialTokensPerPrompt) + 3},
		{EndpointTokenize, `{"model":"m","prompt":"anything at all"}`, 0},
		{EndpointDetokenize, `{"model":"m","tokens":[1,2]}`, 0},
	}
	for _, tc := range cases {
		r, err := Parse(tc.ep, []byte(tc.body), CountOptions{})
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.in, r.TotalInputTokens(), tc.body)
		p, err := r.Plan(Limits{MaxModelLen: 4096, TenantMaxOutput: 100})
		require.NoError(t, err)
		assert.Zero(t, p.OutputTokens, "%s has no output", tc.ep.Path())
	}
	r, err := Parse(EndpointResponses, []byte(`{"model":"m","input":"hi","instructions":"be kind","max_output_tokens":7,"stream":true}`), CountOptions{})
	require.NoError(t, err)
	assert.True(t, r.Stream)
	assert.Equal(t, 7, r.MaxTokens)
	assert.Equal(t, 2+7+DefaultTemplateTokensPerRequest+2*DefaultTemplateTokensPerMessage, r.TotalInputTokens())
	p, err := r.Plan(Limits{MaxModelLen: 4096, TenantMaxOutput: 5})
	require.NoError(t, err)
	assert.Equal(t, 5, p.Cap, "min(client, tenant)")
	var out map[string]any
	require.NoError(t, json.Unmarshal(r.UpstreamBody(nil, p.Cap, RewriteOptions{}), &out))
	assert.EqualValues(t, 5, out["max_output_tokens"])
	assert.Equal(t, "be kind", out["instructions"])

	for _, bad := range []struct {
		ep   Endpoint
		body string
	}{
		{EndpointEmbeddings, `{"model":"m"}`},
		{EndpointRerank, `{"query":"q"}`},
		{EndpointResponses, `{"input":"x","max_output_tokens":0}`},
		{EndpointEmbeddings, `[1]`},
		{EndpointEmbeddings, `{"model":3,"input":"x"}`},
	} {
		_, err := Parse(bad.ep, []byte(bad.body), CountOptions{})
		require.ErrorIs(t, err, ErrInvalidRequest, bad.body)
	}
	ep, ok := EndpointForPath("/v2/rerank")
	assert.True(t, ok)
	assert.Equal(t, "/v1/rerank", ep.Path())
	_, ok = EndpointForPath("/v1/files")
	assert.False(t, ok)
}

func TestBodyUsage(t *testing.T) {
	t.Parallel()
	u, ok := BodyUsage([]byte(`{"data":[],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0,"prompt_tokens_details":null}}`))
	require.True(t, ok)
	assert.Equal(t, Usage{PromptTokens: 9, Known: true, Final: true}, u)
	u, _ = BodyUsage([]byte(`{"object":"response","usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":3,"total_tokens":15}}`))
	assert.Equal(t, Usage{PromptTokens: 12, CompletionTokens: 3, CachedTokens: 8, Known: true, Final: true}, u)
	u, _ = BodyUsage([]byte(`{"results":[],"usage":{"total_tokens":8}}`))
	assert.Equal(t, 8, u.PromptTokens, "rerank's total_tokens is all input")
	_, ok = BodyUsage([]byte(`{"prompt":"x"}`))
	assert.False(t, ok)
}

func TestResponsesStream(t *testing.T) {
	t.Parallel()
	ev := func(typ, rest string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + rest + "}\n\n"
	}
	full := ev("response.created", `,"response":{"usage":null}`) + ev("response.output_text.delta", `,"delta":"a"`) +
		ev("response.output_text.delta", `,"delta":" b"`) +
		ev("response.completed", `,"response":{"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}`)
	s := NewResponsesStream(strings.NewReader(full), 0)
	var got strings.Builder
	for {
		raw, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got.Write(raw)
	}
	assert.Equal(t, full, got.String(), "events pass through byte for byte")
	assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 2, Known: true, Final: true}, s.Settle(99, 1, 100, -1))

	head, _, found := strings.Cut(full, "event: response.completed")
	require.True(t, found)
	cut := NewResponsesStream(strings.NewReader(head), 0)
	var err error
	for err == nil {
		_, err = cut.Next()
	}
	require.ErrorIs(t, err, ErrStreamCut)
	assert.Equal(t, Usage{PromptTokens: 99, CompletionTokens: 4, Known: true}, cut.Settle(99, 1, 100, -1), "the deltas' bytes (1 + 2) plus the allowance")
	assert.Equal(t, 2, cut.Settle(99, 1, 2, -1).CompletionTokens, "never above the cap")
	text, whole := cut.SeenText()
	assert.True(t, whole)
	assert.Equal(t, "a b", text)
	assert.Equal(t, 2+1, cut.Settle(99, 1, 100, 2).CompletionTokens, "the tokenizer's count of the text seen, plus the allowance")
	assert.Equal(t, 2+1, cut.Settle(99, 1, 100, 1).CompletionTokens, "never below one token per delta")
}
