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

func TestParseAnthropicMessages(t *testing.T) {
	t.Parallel()
	r := mustParse(t, EndpointMessages, `{"model":"m","max_tokens":64,"system":"be brief","messages":[{"role":"user","content":"hello"}],"stream":true}`)
	assert.Equal(t, "m", r.Model)
	assert.Equal(t, 64, r.MaxTokens)
	assert.True(t, r.Stream)
	assert.GreaterOrEqual(t, r.TotalInputTokens(), len("be brief")+len("hello"))
	assert.True(t, EndpointMessages.HasOutput())

	img := mustParse(t, EndpointMessages, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+strings.Repeat("A", 9000)+`"}}]}]}`)
	assert.Equal(t, 1, img.MediaParts, "an image block is one media part, whatever its base64 size")
	assert.Less(t, img.TotalInputTokens(), 9000)

	for _, bad := range []struct{ body, param string }{
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{`{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{`{"model":"m","max_tokens":5}`, "messages"},
		{`{"model":"m","max_tokens":5,"max_tokens":50000,"messages":[]}`, "max_tokens"},
	} {
		_, err := Parse(EndpointMessages, []byte(bad.body), CountOptions{})
		var ie *InvalidRequestError
		require.ErrorAs(t, err, &ie, bad.body)
		assert.Equal(t, bad.param, ie.Param, bad.body)
	}

	ct := mustParse(t, EndpointCountTokens, `{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	assert.True(t, EndpointCountTokens.RequestOnly())
	assert.Zero(t, ct.TotalInputTokens())

	var out map[string]any
	require.NoError(t, json.Unmarshal(r.UpstreamBody(nil, 10, RewriteOptions{}), &out))
	assert.EqualValues(t, 10, out["max_tokens"], "the approved cap is written upstream")
}

func TestAnthropicStreamSettle(t *testing.T) {
	t.Parallel()
	ev := func(typ, rest string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + rest + "}\n\n"
	}
	full := ev("message_start", `,"message":{"id":"x","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":17,"output_tokens":0}}`) +
		ev("content_block_start", `,"index":0,"content_block":{"type":"text","text":""}`) +
		ev("content_block_delta", `,"index":0,"delta":{"type":"text_delta","text":"abc"}`) +
		ev("content_block_delta", `,"index":0,"delta":{"type":"text_delta","text":" de"}`) +
		ev("content_block_stop", `,"index":0`) +
		ev("message_delta", `,"delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":17,"output_tokens":2}`) +
		ev("message_stop", ``)
	s := NewResponsesStream(strings.NewReader(full), 0)
	for {
		_, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
	}
	assert.Equal(t, Usage{PromptTokens: 17, CompletionTokens: 2, Known: true, Final: true}, s.Settle(99, 1, 100, -1))

	head, _, _ := strings.Cut(full, "event: content_block_stop")
	cut := NewResponsesStream(strings.NewReader(head), 0)
	var err error
	for err == nil {
		_, err = cut.Next()
	}
	require.ErrorIs(t, err, ErrStreamCut)
	assert.Equal(t, Usage{PromptTokens: 17, CompletionTokens: 3 + 3 + 1, Known: true}, cut.Settle(99, 1, 100, -1),
		"the engine's prompt count, the deltas' bytes and the allowance")
	text, whole := cut.SeenText()
	assert.True(t, whole)
	assert.Equal(t, "abc de", text)
	assert.Equal(t, 17, cut.Settle(99, 1, 100, 2).PromptTokens)
	assert.Equal(t, 3, cut.Settle(99, 1, 100, 2).CompletionTokens)
}

func TestAnthropicCacheUsage(t *testing.T) {
	t.Parallel()
	u, ok := BodyUsage([]byte(`{"usage":{"input_tokens":10,"cache_read_input_tokens":90,"cache_creation_input_tokens":5,"output_tokens":3}}`))
	require.True(t, ok)
	assert.Equal(t, 105, u.PromptTokens, "Anthropic's input_tokens leaves the cache's tokens out")
	assert.Equal(t, 90, u.CachedTokens)
	assert.Equal(t, 3, u.CompletionTokens)
}
