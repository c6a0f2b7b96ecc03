package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startReplica serves a replica on a loopback port until the test ends.
func startReplica(t *testing.T, cfg Config) (*Replica, string) {
	t.Helper()
	r, err := New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r, "http://" + ln.Addr().String()
}

// fastConfig is a config with tiny real-time steps for HTTP tests.
func fastConfig() Config {
	c := DefaultConfig()
	c.DecodeStep = 200 * time.Microsecond
	c.PrefillTPS = 1e7
	return c
}

// reply is what post keeps of a response whose body it has read and closed.
type reply struct {
	StatusCode int
	Header     http.Header
}

func post(t *testing.T, url, body string, hdr ...string) (reply, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}, b
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		require.True(t, strings.HasPrefix(line, "data: "), "line %q", line)
		out = append(out, strings.TrimPrefix(line, "data: "))
	}
	return out
}

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chunkJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON     `json:"usage"`
	Error *errorBodyJSON `json:"error"`
}

type errorBodyJSON struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func decodeChunk(t *testing.T, s string) chunkJSON {
	t.Helper()
	var c chunkJSON
	require.NoError(t, json.Unmarshal([]byte(s), &c), "chunk %q", s)
	return c
}

// timedRecorder is a ResponseWriter that records when each flush happens,
// for handler tests inside synctest bubbles.
type timedRecorder struct {
	mu      sync.Mutex
	hdr     http.Header
	status  int
	pending []byte
	body    []byte
	flushes []flushEvent
}

type flushEvent struct {
	at   time.Time
	data string
}

func newTimedRecorder() *timedRecorder { return &timedRecorder{hdr: http.Header{}} }

func (w *timedRecorder) Header() http.Header { return w.hdr }
func (w *timedRecorder) WriteHeader(s int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = s
	}
}

func (w *timedRecorder) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = 200
	}
	w.pending = append(w.pending, b...)
	w.body = append(w.body, b...)
	return len(b), nil
}

func (w *timedRecorder) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushes = append(w.flushes, flushEvent{at: time.Now(), data: string(w.pending)})
	w.pending = nil
}

func (w *timedRecorder) events() []flushEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]flushEvent(nil), w.flushes...)
}
