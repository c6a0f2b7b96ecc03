package sim

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openStream starts a streamed request and returns its response.
func openStream(ctx context.Context, t *testing.T, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return resp
}

// readEvents reads k SSE data events.
func readEvents(t *testing.T, br *bufio.Reader, k int) {
	t.Helper()
	for n := 0; n < k; {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "data: ") {
			n++
		}
	}
}

const longStream = `{"model":"sim-model","prompt":"a b c","max_tokens":2000,"ignore_eos":true,"stream":true}`

// afterIdle checks that nothing more is generated once the engine is idle:
// a small request afterwards adds exactly its own tokens.
func afterIdle(t *testing.T, r *Replica, url string, before int64) {
	t.Helper()
	resp, b := post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"z","max_tokens":3,"ignore_eos":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, before+3, r.Stats().GenerationTokens, "generation_tokens_total stopped growing")
}

func TestClientDisconnectAbortsStream(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeStep = 5 * time.Millisecond
	r, url := startReplica(t, cfg)
	resp := openStream(t.Context(), t, url+"/v1/completions", longStream)
	readEvents(t, bufio.NewReader(resp.Body), 5)
	genAtClose := r.Stats().GenerationTokens
	require.NoError(t, resp.Body.Close())
	require.Eventually(t, func() bool { return r.Stats().Aborted == 1 }, 5*time.Second, time.Millisecond)
	st := r.Stats()
	// batch 1 makes one token per step: at most the step in flight completes.
	assert.LessOrEqual(t, st.GenerationTokens-genAtClose, int64(2), "stopped within one decode step (got %d more)", st.GenerationTokens-genAtClose)
	assert.Equal(t, int64(0), st.Running)
	assert.Equal(t, int64(0), st.KVBlocksUsed)
	mf := scrapeHTTP(t, url)
	assert.InDelta(t, 1.0, mf.value(t, "sim_aborted_requests_total"), 1e-9)
	assert.InDelta(t, 0.0, mf.value(t, "vllm:num_requests_running"), 1e-9)
	var abortCount float64
	for _, m := range mf["vllm:request_success_total"].GetMetric() {
		if labelsOf(m)["finished_reason"] == "abort" {
			abortCount = m.GetCounter().GetValue()
		}
	}
	assert.InDelta(t, 1.0, abortCount, 1e-9)
	afterIdle(t, r, url, st.GenerationTokens)
}

func TestClientDisconnectAbortsNonStream(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeStep = 5 * time.Millisecond
	r, url := startReplica(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":2000,"ignore_eos":true}`))
		if err != nil {
			errc <- err
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	require.Eventually(t, func() bool { return r.Stats().GenerationTokens >= 5 }, 5*time.Second, time.Millisecond)
	genAtClose := r.Stats().GenerationTokens
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Eventually(t, func() bool { return r.Stats().Aborted == 1 }, 5*time.Second, time.Millisecond)
	st := r.Stats()
	assert.LessOrEqual(t, st.GenerationTokens-genAtClose, int64(2), "stopped within one decode step (got %d more)", st.GenerationTokens-genAtClose)
	assert.Equal(t, int64(0), st.Running)
	afterIdle(t, r, url, st.GenerationTokens)
}

func TestClientDisconnectWhileWaiting(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeStep = 2 * time.Millisecond
	cfg.MaxNumSeqs = 1
	r, url := startReplica(t, cfg)
	first := openStream(t.Context(), t, url+"/v1/completions", longStream)
	defer first.Body.Close()
	readEvents(t, bufio.NewReader(first.Body), 1)
	second := openStream(t.Context(), t, url+"/v1/completions", longStream)
	require.Eventually(t, func() bool { return r.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, second.Body.Close())
	require.Eventually(t, func() bool { return r.Stats().Aborted == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int64(0), r.Stats().Waiting)
	assert.Equal(t, int64(1), r.Stats().Running)
}

func TestOnDisconnectIgnoreKeepsGenerating(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
	}{
		{"stream", true},
		{"non-stream", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fastConfig()
			cfg.DecodeStep = time.Millisecond
			cfg.OnDisconnect = OnDisconnectIgnore
			r, url := startReplica(t, cfg)
			body := `{"model":"sim-model","prompt":"a","max_tokens":300,"ignore_eos":true,"stream":false}`
			ctx, cancel := context.WithCancel(t.Context())
			if tt.stream {
				body = strings.Replace(body, `"stream":false`, `"stream":true`, 1)
				resp := openStream(ctx, t, url+"/v1/completions", body)
				readEvents(t, bufio.NewReader(resp.Body), 3)
				require.NoError(t, resp.Body.Close())
			} else {
				errc := make(chan error, 1)
				go func() {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
					resp, err := http.DefaultClient.Do(req)
					if err == nil {
						resp.Body.Close()
					}
					errc <- err
				}()
				require.Eventually(t, func() bool { return r.Stats().GenerationTokens >= 3 }, 5*time.Second, time.Millisecond)
				cancel()
				require.Error(t, <-errc)
			}
			cancel()
			require.Eventually(t, func() bool { return r.Stats().FinishedSeqs == 1 }, 10*time.Second, time.Millisecond)
			st := r.Stats()
			assert.Equal(t, int64(300), st.GenerationTokens, "generated to the end")
			assert.Equal(t, int64(0), st.Aborted)
		})
	}
}

func TestOnDisconnectNextWrite(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeStep = time.Millisecond
	cfg.OnDisconnect = OnDisconnectNextWrite
	r, url := startReplica(t, cfg)
	resp := openStream(t.Context(), t, url+"/v1/completions", longStream)
	readEvents(t, bufio.NewReader(resp.Body), 3)
	require.NoError(t, resp.Body.Close())
	require.Eventually(t, func() bool { return r.Stats().Aborted == 1 }, 10*time.Second, time.Millisecond)
	assert.Less(t, r.Stats().GenerationTokens, int64(2000))
	assert.Equal(t, int64(0), r.Stats().Running)
}
