package vllm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A non-streamed request sent upstream as a stream for evidence: stream,
// continuous usage and Sluice's interval are written, the client's own
// (ignored by vLLM on a non-streamed request) stream_interval dropped.
func TestRewriteNonStreamedAsStream(t *testing.T) {
	r, err := Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"hi"}],"stream":false,"stream_interval":3,"max_tokens":500}`), CountOptions{})
	require.NoError(t, err)
	assert.Equal(t, `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"stream_interval":64,"max_completion_tokens":500,"max_tokens":500}`,
		string(r.RewriteWith(nil, 500, RewriteOptions{StreamInterval: 64})))
	assert.Equal(t, `{"messages":[{"role":"user","content":"hi"}],"stream":false,"stream_interval":3,"max_completion_tokens":500,"max_tokens":500}`,
		string(r.RewriteWith(nil, 500, RewriteOptions{})), "interval 0: non-streamed as before")
	r, err = Parse(EndpointCompletions, []byte(`{"prompt":"hi"}`), CountOptions{})
	require.NoError(t, err)
	assert.Equal(t, `{"prompt":"hi","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"stream_interval":8}`,
		string(r.RewriteWith(nil, 0, RewriteOptions{StreamInterval: 8})))
}

func TestReassemblable(t *testing.T) {
	for _, tc := range []struct {
		ep   Endpoint
		body string
		want bool
	}{
		{EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"temperature":0.5,"logprobs":true,"top_logprobs":2,"response_format":{"type":"json_object"}}`, true},
		{EndpointCompletions, `{"model":"m","prompt":"hi","logprobs":2,"n":3,"stop":["x"]}`, true},
		{EndpointChat, `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, false},
		{EndpointChat, `{"messages":[{"role":"user","content":"x"}],"tool_choice":"none"}`, false},
		{EndpointCompletions, `{"prompt":"hi","echo":true}`, false},
		{EndpointCompletions, `{"prompt":"hi","prompt_logprobs":1}`, false},
		{EndpointCompletions, `{"prompt":"hi","use_beam_search":true}`, false},
		{EndpointChat, `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, false},
		{EndpointChat, `{"messages":[{"role":"user","content":"x"}],"stream":true}`, false},
		{EndpointChat, `{"messages":[{"role":"user","content":"x"}],"some_extension":1}`, false},
		{EndpointCompletions, `{"prompt":"hi","messages":[{"role":"user","content":"x"}]}`, false},
		{EndpointChat, `{"messages":[{"role":"user","content":"x"}],"\u006dodel":"m"}`, false},
	} {
		r, err := Parse(tc.ep, []byte(tc.body), CountOptions{})
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.want, r.Reassemblable(), tc.body)
	}
}
