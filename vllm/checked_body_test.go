package vllm

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deep returns a JSON value nested n arrays deep.
func deep(n int) string { return strings.Repeat("[", n) + "1" + strings.Repeat("]", n) }

var allEndpoints = []struct {
	ep   Endpoint
	body string // a valid body with a model member; %s is where extra members go
}{
	{EndpointChat, `{"model":"small",%s"messages":[{"role":"user","content":"hi"}]}`},
	{EndpointCompletions, `{"model":"small",%s"prompt":"hi"}`},
	{EndpointEmbeddings, `{"model":"small",%s"input":"hi"}`},
	{EndpointPooling, `{"model":"small",%s"input":"hi"}`},
	{EndpointClassify, `{"model":"small",%s"input":"hi"}`},
	{EndpointScore, `{"model":"small",%s"text_1":"a","text_2":"b"}`},
	{EndpointRerank, `{"model":"small",%s"query":"a","documents":["b"]}`},
	{EndpointResponses, `{"model":"small",%s"input":"hi"}`},
}

// The body Sluice sizes is the body vLLM runs: a member Sluice cannot read
// (nested past its scanner's depth) must not hide a later member that
// vLLM's json.loads would read, and a key given twice (json.loads keeps
// the last) is refused on every endpoint.
func TestBodyIsReadWholeOrRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range allEndpoints {
		for name, extra := range map[string]string{
			"deep member then a second model": `"x":` + deep(maxDepth+10) + `,"model":"big",`,
			"duplicate model":                 `"model":"big",`,
			"duplicate model, escaped":        `"mod\u0065l":"big",`,
		} {
			body := strings.Replace(tc.body, "%s", extra, 1)
			require.True(t, json.Valid([]byte(body)), body)
			r, err := Parse(tc.ep, []byte(body), CountOptions{})
			require.ErrorIs(t, err, ErrInvalidRequest, "%s %s: model %q", tc.ep.Path(), name, modelOf(r))
		}
		ok := strings.Replace(tc.body, "%s", `"x":`+deep(maxDepth-10)+`,`, 1)
		_, err := Parse(tc.ep, []byte(ok), CountOptions{})
		require.NoError(t, err, "%s: nesting within the scanner's depth is read", tc.ep.Path())
	}
}

func modelOf(r *Request) string {
	if r == nil {
		return ""
	}
	return r.Model
}

func TestDuplicateKeyIsNamed(t *testing.T) {
	t.Parallel()
	_, err := Parse(EndpointEmbeddings, []byte(`{"input":"a","input":["`+strings.Repeat("x", 6000)+`"]}`), CountOptions{})
	var ie *InvalidRequestError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "input", ie.Param)
	assert.Contains(t, ie.Reason, "more than once")
	_, err = Parse(EndpointChat, []byte(`{"messages":[{"role":"user","content":"a"}],"max_tokens":5,"max_tokens":50000}`), CountOptions{})
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "max_tokens", ie.Param)
}

// vLLM's embedding request is a union of the completion and chat forms;
// with both input and messages it runs input (pydantic's smart union), so
// sizing messages would let input run unsized.
func TestEmbeddingsWithInputAndMessagesRefused(t *testing.T) {
	t.Parallel()
	big := `"` + strings.Repeat("word ", 2000) + `"`
	for _, ep := range []Endpoint{EndpointEmbeddings, EndpointPooling, EndpointClassify} {
		_, err := Parse(ep, []byte(`{"messages":[{"role":"user","content":"hi"}],"input":`+big+`}`), CountOptions{})
		var ie *InvalidRequestError
		require.ErrorAs(t, err, &ie, ep.Path())
		assert.Equal(t, "messages", ie.Param)
	}
}

// Everything a chat template renders counts: RAG documents and the values
// of chat_template_kwargs are in the bound.
func TestChatDocumentsAndTemplateKwargsCounted(t *testing.T) {
	t.Parallel()
	filler := strings.Repeat("y", 100_000)
	base := mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"hi"}]}`).TotalInputTokens()
	docs := mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"hi"}],"documents":[{"title":"t","text":"`+filler+`"}]}`)
	assert.GreaterOrEqual(t, docs.TotalInputTokens()-base, len(filler))
	kw := mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"system":"`+filler+`"}}`)
	assert.GreaterOrEqual(t, kw.TotalInputTokens()-base, len(filler))

	// /tokenize renders kwargs but takes no documents: their bound is
	// added to its count, which is then no longer exact.
	exact, err := docs.WithTokenizedInput([]int{20}, 64)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, exact.TotalInputTokens(), 20+len(filler))
	assert.False(t, exact.InputExact, "a bound is never the reason for a context-length 400")
	assert.True(t, exact.Tokenized)

	tmpl := mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"hi"}],"chat_template":"{% for i in range(100000) %}x{% endfor %}"}`)
	assert.True(t, tmpl.NeedsExactCount(), "a template from the body is bounded by no bytes rule")
	assert.False(t, mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"hi"}]}`).NeedsExactCount())
}

func TestResponsesInputBound(t *testing.T) {
	t.Parallel()
	url := `"https://example.com/cat.png"`
	img := mustParse(t, EndpointResponses, `{"input":[{"role":"user","content":[{"type":"input_text","text":"what is it?"},{"type":"input_image","image_url":`+url+`}]}]}`)
	text := mustParse(t, EndpointResponses, `{"input":[{"role":"user","content":[{"type":"input_text","text":"what is it?"}]}]}`)
	assert.Equal(t, 1, img.MediaParts)
	assert.Equal(t, DefaultMediaTokensPerPart, img.TotalInputTokens()-text.TotalInputTokens(), "an image counts the media allowance, not its URL's bytes")

	chatImg := mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":`+url+`}}]}]}`)
	assert.Equal(t, 1, chatImg.MediaParts, "the same image on chat")
	counted, err := chatImg.WithTokenizedInput([]int{12}, 64)
	require.NoError(t, err)
	assert.Equal(t, 12+DefaultMediaTokensPerPart, counted.TotalInputTokens(), "/tokenize counts a placeholder, not the image's tokens")
	assert.False(t, counted.InputExact)
	emb := mustParse(t, EndpointEmbeddings, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":`+url+`}}]}]}`)
	assert.Equal(t, 1, emb.MediaParts, "and on the embeddings chat form")

	_, err = Parse(EndpointResponses, []byte(`{"input":"hi","background":true}`), CountOptions{})
	var ie *InvalidRequestError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "background", ie.Param)
	_, err = Parse(EndpointResponses, []byte(`{"input":"hi","background":false}`), CountOptions{})
	require.NoError(t, err)

	prev := mustParse(t, EndpointResponses, `{"input":"and then?","previous_response_id":"resp_1","max_output_tokens":100}`)
	p, err := prev.Plan(Limits{MaxModelLen: 8192})
	require.NoError(t, err)
	assert.Equal(t, 8192-100, p.InputTokens, "the stored conversation is bounded by the context")
	assert.Equal(t, 100, p.Cap)
	_, err = prev.Plan(Limits{})
	require.ErrorIs(t, err, ErrInvalidRequest, "an unknown context bounds nothing")
}

// The client's priority never reaches vLLM, whatever the endpoint: on a
// replica scheduling by priority it would preempt other tenants' work.
func TestUpstreamBodyDropsPriority(t *testing.T) {
	t.Parallel()
	for _, tc := range allEndpoints {
		if tc.ep == EndpointChat || tc.ep == EndpointCompletions {
			continue // Rewrite, TestRewriteNeverForwardsTheClientsPriority
		}
		r := mustParse(t, tc.ep, strings.Replace(tc.body, "%s", `"priority":-5,`, 1))
		var got map[string]any
		require.NoError(t, json.Unmarshal(r.UpstreamBody(nil, 10, RewriteOptions{}), &got))
		assert.NotContains(t, got, "priority", tc.ep.Path())
		require.NoError(t, json.Unmarshal(r.UpstreamBody(nil, 10, RewriteOptions{SetPriority: true, Priority: 3}), &got))
		assert.EqualValues(t, 3, got["priority"], tc.ep.Path())
	}
}

// deepBody is 4 MiB of text under 500 levels of arrays: a reader that
// re-scans everything below each level reads the text 500 times.
func deepBody(field string) []byte {
	inner := `"` + strings.Repeat("x", 4<<20) + `"`
	return []byte(`{"model":"m","` + field + `":` + strings.Repeat("[", 500) + inner + strings.Repeat("]", 500) + `}`)
}

func BenchmarkParseDeepBody(b *testing.B) {
	for _, tc := range []struct {
		name string
		ep   Endpoint
		body []byte
	}{
		{"embeddings", EndpointEmbeddings, deepBody("input")},
		{"responses", EndpointResponses, deepBody("input")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			for b.Loop() {
				if _, err := Parse(tc.ep, tc.body, CountOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidJSON: the strict walk every admitted body takes.
func BenchmarkValidJSON(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant.\n"},{"role":"user","content":"Write a haiku about the sea, with \"quotes\" and \u00e9 and numbers 12.5e3 -0 true false null"}],"max_tokens":256,"temperature":0.7,"stream":true,"stream_options":{"include_usage":true}}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !validJSON(body) {
			b.Fatal("invalid")
		}
	}
}
