package vllm

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func streamOf(s string) *Stream {
	return NewStream(io.NopCloser(strings.NewReader(s)), "http://r0", 0)
}

// drain reads every event; it returns the events' raw bytes concatenated and
// the terminal error.
func drain(t *testing.T, s *Stream) ([]Event, error) {
	t.Helper()
	var evs []Event
	for {
		ev, err := s.Next()
		if err != nil {
			return evs, err
		}
		ev.Raw = bytes.Clone(ev.Raw)
		ev.Data = bytes.Clone(ev.Data)
		evs = append(evs, ev)
	}
}

func TestStreamGoldenChatN2(t *testing.T) {
	t.Parallel()
	raw := readTestdata(t, "chat_stream_n2.sse")
	s := streamOf(string(raw))
	evs, err := drain(t, s)
	require.ErrorIs(t, err, io.EOF)
	require.Len(t, evs, 9)

	var joined []byte
	for _, ev := range evs {
		joined = append(joined, ev.Raw...)
	}
	assert.Equal(t, string(raw), string(joined), "raw events must reproduce the stream byte for byte")

	assert.Equal(t, 0, evs[0].Choice)
	assert.Equal(t, 1, evs[1].Choice)
	assert.True(t, evs[3].HasUsage)
	assert.Equal(t, ChunkUsage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15}, evs[3].Usage)
	assert.False(t, evs[6].Final)
	assert.True(t, evs[7].Final)
	assert.Equal(t, -1, evs[7].Choice)
	assert.True(t, evs[8].Done)
	assert.Equal(t, Usage{PromptTokens: 12, CompletionTokens: 5, Final: true, Known: true, Choices: 2}, s.Usage())
}

func TestStreamCumulativeUsageWithoutFinal(t *testing.T) {
	t.Parallel()
	raw := readTestdata(t, "chat_stream_n2.sse")
	// Cut after the 5th event: choice 0 at 2 tokens, choice 1 at 3.
	events := strings.SplitAfter(string(raw), "\n\n")
	s := streamOf(strings.Join(events[:5], ""))
	_, err := drain(t, s)
	require.ErrorIs(t, err, ErrStreamCut)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, Usage{PromptTokens: 12, CompletionTokens: 5, Known: true, Choices: 2}, s.Usage())
	assert.False(t, s.Done())
}

func TestStreamEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		wantData  []string
		wantErr   error
		wantUsage Usage
	}{
		{
			name:     "crlf and comments and multi-line data",
			in:       ": ping\r\n\r\nevent: x\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata:[DONE]\r\n\r\n",
			wantData: []string{"{\"a\":\n1}", "[DONE]"},
			wantErr:  io.EOF,
		},
		{
			name:     "completions usage null",
			in:       "data: {\"choices\":[{\"index\":2,\"text\":\"x\"}],\"usage\":null}\n\ndata: [DONE]\n\n",
			wantData: []string{"{\"choices\":[{\"index\":2,\"text\":\"x\"}],\"usage\":null}", "[DONE]"},
			wantErr:  io.EOF,
		},
		{
			name:     "cut mid event",
			in:       "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: {\"cho",
			wantData: []string{"{\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}"},
			wantErr:  ErrStreamCut,
			wantUsage: Usage{
				PromptTokens: 4, CompletionTokens: 2, Known: true, Choices: 1,
			},
		},
		{
			name:    "empty body",
			in:      "",
			wantErr: ErrStreamCut,
		},
		{
			name:     "malformed json chunk is passed through without usage",
			in:       "data: {not json\n\ndata: [DONE]\n\n",
			wantData: []string{"{not json", "[DONE]"},
			wantErr:  io.EOF,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := streamOf(tt.in)
			evs, err := drain(t, s)
			require.ErrorIs(t, err, tt.wantErr)
			var got []string
			for _, ev := range evs {
				got = append(got, string(ev.Data))
			}
			assert.Equal(t, tt.wantData, got)
			assert.Equal(t, tt.wantUsage, s.Usage())
		})
	}
}

func TestStreamErrorEvent(t *testing.T) {
	t.Parallel()
	in := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"error\": {\"message\": \"boom\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\n" +
		"data: [DONE]\n\n"
	s := streamOf(in)
	evs, err := drain(t, s)
	require.ErrorIs(t, err, io.EOF)
	require.Len(t, evs, 3)
	e := evs[1].Err
	require.NotNil(t, e)
	assert.Equal(t, UpstreamError{
		Replica: "http://r0", Status: 500, Type: "InternalServerError", Code: "500",
		Body:     []byte(`{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}`),
		InStream: true,
	}, *e)
	assert.NotContains(t, e.Error(), "boom", "error strings never carry upstream messages")
}

func TestStreamEventTooLarge(t *testing.T) {
	t.Parallel()
	big := "data: " + strings.Repeat("x", 100<<10) + "\n\n"
	s := NewStream(io.NopCloser(strings.NewReader(big)), "r", 64<<10)
	_, err := s.Next()
	require.ErrorIs(t, err, ErrEventTooLarge)
	_, err2 := s.Next()
	assert.ErrorIs(t, err2, ErrEventTooLarge, "errors are sticky")
}

func TestStreamCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	s := streamOf("data: [DONE]\n\n")
	_, err := s.Next()
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err = s.Next()
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, errClosed))
}

func TestStreamSettle(t *testing.T) {
	t.Parallel()
	const c0 = `data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":10,"completion_tokens":4}}` + "\n\n"
	const c1done = `data: {"choices":[{"index":1,"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":6}}` + "\n\n"
	const final = `data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":9}}` + "\n\n"
	tests := []struct {
		name                    string
		in                      string
		choices, allow, cap, pt int
		want                    Usage
	}{
		{
			name: "no chunk: prompt from admission, allowance per choice",
			in:   "", choices: 2, allow: 3, cap: 100, pt: 55,
			want: Usage{PromptTokens: 55, CompletionTokens: 6},
		},
		{
			name: "running choice gets allowance, finished one does not, unseen one gets allowance",
			in:   c0 + c1done, choices: 3, allow: 2, cap: 100, pt: 55,
			want: Usage{PromptTokens: 10, CompletionTokens: (4 + 2) + 6 + 2, Known: true, Choices: 2},
		},
		{
			name: "allowance capped",
			in:   c0, choices: 1, allow: 10, cap: 5, pt: 55,
			want: Usage{PromptTokens: 10, CompletionTokens: 5, Known: true, Choices: 1},
		},
		{
			name: "final usage wins",
			in:   c0 + c1done + final, choices: 2, allow: 10, cap: 50, pt: 55,
			want: Usage{PromptTokens: 10, CompletionTokens: 9, Final: true, Known: true, Choices: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := streamOf(tt.in)
			_, _ = drain(t, s)
			assert.Equal(t, tt.want, s.Settle(tt.choices, tt.allow, tt.cap, tt.pt))
		})
	}
}

// BeforeRead runs before each read of the connection, never between events
// that one read brought: two events in one read, one call.
func TestStreamBeforeReadOncePerRead(t *testing.T) {
	pr, pw := io.Pipe()
	s := NewStream(pr, "r", 0)
	defer s.Close()
	calls := 0
	s.BeforeRead(func() { calls++ })
	go func() {
		_, _ = io.WriteString(pw, "data: {\"choices\":[]}\n\ndata: {\"choices\":[]}\n\n")
		_, _ = io.WriteString(pw, "data: [DONE]\n\n")
		_ = pw.Close()
	}()
	for i := range 2 {
		_, err := s.Next()
		require.NoError(t, err)
		assert.Equal(t, 1, calls, "event %d came from the first read", i)
	}
	ev, err := s.Next()
	require.NoError(t, err)
	assert.True(t, ev.Done)
	assert.Equal(t, 2, calls)
	_, err = s.Next()
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, 2, calls, "[DONE] ends the stream without a read")
}
