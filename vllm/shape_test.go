package vllm

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustParse(t testing.TB, ep Endpoint, body string) *Request {
	t.Helper()
	r, err := Parse(ep, []byte(body), CountOptions{})
	require.NoError(t, err)
	return r
}

func shapeAll(t *testing.T, stream string, r *Request) string {
	t.Helper()
	s := streamOf(stream)
	var out []byte
	for {
		ev, err := s.Next()
		if err == io.EOF {
			return string(out)
		}
		require.NoError(t, err)
		out, _ = ShapeChunk(out, ev, r)
	}
}

func TestShapeChunk(t *testing.T) {
	t.Parallel()
	const chatStream = `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}` + "\n\n" +
		`data: {"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2},"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"id":"c"}` + "\n\n" +
		`data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}` + "\n\n" +
		"data: [DONE]\n\n"
	const cmplStream = `data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}` + "\n\n" +
		`data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}` + "\n\n" +
		"data: [DONE]\n\n"
	msgs := `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		name   string
		ep     Endpoint
		body   string
		stream string
		want   string
	}{
		{
			name:   "chat without stream_options: no usage at all",
			ep:     EndpointChat,
			body:   `{"stream":true,` + msgs + `}`,
			stream: chatStream,
			want: `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"id":"c"}` + "\n\n" +
				"data: [DONE]\n\n",
		},
		{
			name:   "chat with stream_options {}: final usage chunk only",
			ep:     EndpointChat,
			body:   `{"stream":true,"stream_options":{},` + msgs + `}`,
			stream: chatStream,
			want: `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"id":"c"}` + "\n\n" +
				`data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}` + "\n\n" +
				"data: [DONE]\n\n",
		},
		{
			name:   "chat with continuous usage: everything",
			ep:     EndpointChat,
			body:   `{"stream":true,"stream_options":{"continuous_usage_stats":true},` + msgs + `}`,
			stream: chatStream,
			want:   chatStream,
		},
		{
			name:   "chat include_usage false",
			ep:     EndpointChat,
			body:   `{"stream":true,"stream_options":{"include_usage":false},` + msgs + `}`,
			stream: chatStream,
			want: `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],"id":"c"}` + "\n\n" +
				"data: [DONE]\n\n",
		},
		{
			name:   "completions: usage becomes null as vLLM sends it",
			ep:     EndpointCompletions,
			body:   `{"stream":true,"prompt":"x"}`,
			stream: cmplStream,
			want: `data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"a"}],"usage":null}` + "\n\n" +
				"data: [DONE]\n\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := shapeAll(t, tt.stream, mustParse(t, tt.ep, tt.body))
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestShapeChunkOnlyUsageMember(t *testing.T) {
	t.Parallel()
	s := streamOf(`data: {"usage":{"prompt_tokens":1,"completion_tokens":1},"choices":[{"index":0}]}` + "\n\n" +
		`data: { "choices" : [{"index":0}] , "usage" : {"prompt_tokens":1,"completion_tokens":2} }` + "\n\n")
	r := mustParse(t, EndpointChat, `{"messages":[{"role":"user","content":"x"}]}`)
	ev, err := s.Next()
	require.NoError(t, err)
	out, ok := ShapeChunk(nil, ev, r)
	require.True(t, ok)
	assert.Equal(t, `data: {"choices":[{"index":0}]}`+"\n\n", string(out))
	ev, err = s.Next()
	require.NoError(t, err)
	out, _ = ShapeChunk(nil, ev, r)
	assert.Equal(t, `data: { "choices" : [{"index":0}] }`+"\n\n", string(out))
	data := bytes.TrimSuffix(bytes.TrimPrefix(out, []byte("data: ")), []byte("\n\n"))
	assert.True(t, json.Valid(data))
}

func assemble(t *testing.T, ep Endpoint, stream string) ([]byte, error) {
	t.Helper()
	a := NewAssembler(ep)
	s := streamOf(stream)
	for {
		ev, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			_, berr := a.Body()
			require.Error(t, berr)
			return nil, err
		}
		if err := a.Add(ev); err != nil {
			return nil, err
		}
	}
	return a.Body()
}

func TestAssemblerGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ep     Endpoint
		stream string
		golden string
	}{
		{"chat n=2", EndpointChat, "chat_stream_n2.sse", "chat_n2.golden.json"},
		{"chat tool calls and reasoning", EndpointChat, "chat_tools.sse", "chat_tools.golden.json"},
		{"completions logprobs", EndpointCompletions, "completions_logprobs.sse", "completions_logprobs.golden.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := assemble(t, tt.ep, string(readTestdata(t, tt.stream)))
			require.NoError(t, err)
			want := strings.TrimSpace(string(readTestdata(t, tt.golden)))
			assert.Equal(t, want, string(got))
			assert.True(t, json.Valid(got))
		})
	}
}

func TestAssemblerErrors(t *testing.T) {
	t.Parallel()
	t.Run("sse error event", func(t *testing.T) {
		t.Parallel()
		_, err := assemble(t, EndpointChat, `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n"+
			`data: {"object":"error","message":"x","type":"BadRequestError","param":"input_tokens","code":400}`+"\n\n"+
			"data: [DONE]\n\n")
		var ue *UpstreamError
		require.ErrorAs(t, err, &ue)
		assert.Equal(t, 400, ue.Status)
		assert.Equal(t, "BadRequestError", ue.Type)
		assert.Equal(t, "input_tokens", ue.Param)
		assert.True(t, ue.InStream)
		assert.True(t, ue.ContextLength())
	})
	t.Run("cut before done", func(t *testing.T) {
		t.Parallel()
		_, err := assemble(t, EndpointChat, `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n")
		require.ErrorIs(t, err, ErrStreamCut)
	})
	t.Run("body before done", func(t *testing.T) {
		t.Parallel()
		a := NewAssembler(EndpointChat)
		_, err := a.Body()
		require.ErrorIs(t, err, ErrStreamCut)
	})
}

func TestWriteJSONStringMatchesPydantic(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	writeJSONString(&b, "a\"b\\c\n\x01<é>&")
	assert.Equal(t, `"a\"b\\c\n\u0001<é>&"`, b.String())
}

// FuzzShapeOnePass: ShapeChunk with parseChunk's usage geometry (one JSON
// pass per chunk) writes exactly what it writes when it scans the chunk
// itself, for chat and completions, on well-formed and malformed chunks.
func FuzzShapeOnePass(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","choices":[{"index":0,"text":"a","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
		`{"usage":{"prompt_tokens":3,"completion_tokens":1},"id":"x","choices":[]}`,
		`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
		`{ "a" : 1 , "usage" : {"prompt_tokens":3,"completion_tokens":2} , "b" : [1,{"c":"}"}] }`,
		`{"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":{"prompt_tokens":9,"completion_tokens":9},"z":0}`,
		`{"a":"\"usage\"","usage":{"prompt_tokens":5,"completion_tokens":1},"b":`,
		`{"usage":{"prompt_tokens":5,"completion_tokens":1}, garbage`,
		`{"u\u0073age":{"prompt_tokens":5,"completion_tokens":1},"x":1}`,
	} {
		f.Add(uint8(1), s)
		f.Add(uint8(2), s)
	}
	f.Fuzz(func(t *testing.T, ep uint8, data string) {
		e := Endpoint(ep%2 + 1)
		r := &Request{Endpoint: e, Stream: true}
		ev := Event{Raw: []byte("data: " + data + "\n\n"), Data: []byte(data)}
		parseChunk(ev.Data, &ev, "r")
		if !ev.at.ok {
			t.Fatal("parseChunk left no usage geometry")
		}
		scanned := ev
		scanned.at = usageAt{}
		got, gotOK := ShapeChunk(nil, ev, r)
		want, wantOK := ShapeChunk(nil, scanned, r)
		if gotOK != wantOK || string(got) != string(want) {
			t.Fatalf("one pass %q (%v), own scan %q (%v)", got, gotOK, want, wantOK)
		}
	})
}
