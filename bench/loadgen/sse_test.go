package loadgen

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readAll(t *testing.T, r io.Reader) ([]string, error) {
	t.Helper()
	n := time.Duration(0)
	sr := NewSSEReader(r, func() time.Duration { n++; return n })
	var out []string
	for {
		ev, err := sr.Next()
		if err != nil {
			return out, err
		}
		if ev.Keepalive {
			out = append(out, ":ka")
			continue
		}
		out = append(out, string(ev.Data))
	}
}

func TestSSEFixtures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		want []string
	}{
		{"lf", "data: a\n\ndata: b\n\n", []string{"a", "b"}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"a", "b"}},
		{"no space", "data:a\n\n", []string{"a"}},
		{"joined", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"comment keepalive", ": ping\n\ndata: x\n\n", []string{":ka", "x"}},
		{"other fields ignored", "event: message\nid: 3\nretry: 10\ndata: x\n\n", []string{"x"}},
		{"field only, no data", "event: foo\n\ndata: y\n\n", []string{"y"}},
		{"extra blank lines", "\n\n\ndata: x\n\n\n", []string{"x"}},
		{"no final blank line", "data: x\n\ndata: [DONE]", []string{"x", "[DONE]"}},
		{"usage only last", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
			[]string{`{"choices":[{"text":"a"}]}`, `{"choices":[],"usage":{"completion_tokens":1}}`, "[DONE]"}},
		{"mid-stream error", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"code\":\"deadline_exceeded\"}}\n\n",
			[]string{`{"choices":[{"text":"a"}]}`, `{"error":{"code":"deadline_exceeded"}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got, err := readAll(t, r)
				require.ErrorIs(t, err, io.EOF)
				assert.Equal(t, tc.want, got)
			}
		})
	}
}

func TestSSEStampsFirstLine(t *testing.T) {
	t.Parallel()
	clock := time.Duration(0)
	sr := NewSSEReader(strings.NewReader("data: a\ndata: b\n\ndata: c\n\n"), func() time.Duration { clock += 10; return clock })
	ev, err := sr.Next()
	require.NoError(t, err)
	assert.Equal(t, time.Duration(10), ev.At, "stamped at the first line, not the blank one")
	ev, err = sr.Next()
	require.NoError(t, err)
	assert.Equal(t, time.Duration(20), ev.At)
}

func TestSSELineTooLong(t *testing.T) {
	t.Parallel()
	in := "data: " + strings.Repeat("x", MaxLine+10) + "\n\n"
	_, err := readAll(t, strings.NewReader(in))
	require.ErrorIs(t, err, ErrLineTooLong)
	big := "data: " + strings.Repeat("y", 200_000) + "\n\n"
	got, err := readAll(t, strings.NewReader(big))
	require.ErrorIs(t, err, io.EOF)
	require.Len(t, got, 1)
	assert.Len(t, got[0], 200_000)
}

func FuzzSSE(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "data:a\r\n\r\n:c\n\n", "data: a\ndata: b\n\nid: 1\n", "\r\n\n:", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sr := NewSSEReader(strings.NewReader(s), func() time.Duration { return 0 })
		for range len(s) + 2 {
			ev, err := sr.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrLineTooLong) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(ev.Data) > len(s) {
				t.Fatalf("event longer than input")
			}
		}
		t.Fatalf("more events than bytes")
	})
}
