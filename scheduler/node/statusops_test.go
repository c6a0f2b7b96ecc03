package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// opsReport is the part of /status/report.json an operator watches over
// time.
type opsReport struct {
	Version    string    `json:"version"`
	StartedAt  time.Time `json:"started_at"`
	UptimeS    *int64    `json:"uptime_s"`
	ConfigFile *string   `json:"config_file"`
	Refusals   []struct {
		At      time.Time `json:"at"`
		Tenant  string    `json:"tenant"`
		Status  int       `json:"status"`
		Code    string    `json:"code"`
		Message string    `json:"message"`
	} `json:"refusals"`
	Tenants []struct {
		Name         string  `json:"name"`
		Concurrency  int     `json:"concurrency"`
		MaxDepth     int     `json:"max_depth"`
		MaxWait      string  `json:"max_wait"`
		ReqPerSec    float64 `json:"req_per_s"`
		TokPerSec    float64 `json:"tok_per_s"`
		TTFTP50      *int64  `json:"ttft_p50_ms"`
		TTFTP99      *int64  `json:"ttft_p99_ms"`
		WaitP50      *int64  `json:"queue_wait_p50_ms"`
		WaitP99      *int64  `json:"queue_wait_p99_ms"`
		QueuedPeak   *int64  `json:"queued_peak"`
		InflightPeak *int64  `json:"inflight_peak"`
	} `json:"tenants"`
	Replicas []struct {
		Name       string     `json:"name"`
		State      string     `json:"state"`
		StateSince *time.Time `json:"state_since"`
		StateForS  int64      `json:"state_for_s"`
	} `json:"replicas"`
}

func (n *node) opsReport(t *testing.T) opsReport {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, n.adminURL+"/status/report.json", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+statusToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var r opsReport
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	return r
}

// TestStatusReportOps pins the JSON behind the status page's operator
// columns: version and uptime, each tenant's queue bounds next to its
// depth, rates, TTFT and queue-wait percentiles and peaks, the recent
// refusals with tenant, code and message, and how long each replica has
// been in its state.
func TestStatusReportOps(t *testing.T) {
	n, _ := statusNode(t)
	r := n.opsReport(t)
	assert.NotEmpty(t, r.Version)
	require.NotNil(t, r.UptimeS)
	assert.GreaterOrEqual(t, *r.UptimeS, int64(0))
	assert.False(t, r.StartedAt.IsZero())
	require.NotNil(t, r.ConfigFile)
	assert.Empty(t, r.Refusals)
	require.Len(t, r.Tenants, 2)
	acme := r.Tenants[0]
	assert.Equal(t, "acme", acme.Name)
	assert.Equal(t, 256, acme.MaxDepth, "the queue's max_depth next to it (default)")
	assert.NotEmpty(t, acme.MaxWait)
	assert.Nil(t, acme.TTFTP50, "no percentile without requests")

	for range 4 {
		require.Equal(t, 200, n.call(t, "/v1/chat/completions", keyAcme, chatBody).StatusCode)
	}
	refused := n.call(t, "/v1/chat/completions", keyAcme, `{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}`)
	require.Equal(t, 404, refused.StatusCode, string(refused.Body))

	eventually(t, "a sample after the requests", func() bool {
		r = n.opsReport(t)
		return r.Tenants[0].ReqPerSec > 0 && r.Tenants[0].TTFTP50 != nil
	})
	acme = r.Tenants[0]
	assert.Greater(t, acme.TokPerSec, 0.0)
	require.NotNil(t, acme.TTFTP99)
	assert.GreaterOrEqual(t, *acme.TTFTP99, *acme.TTFTP50)
	require.NotNil(t, acme.WaitP50, "every request waited, if only a moment")
	require.NotNil(t, acme.InflightPeak)
	require.NotNil(t, acme.QueuedPeak)
	assert.Nil(t, r.Tenants[1].TTFTP50, "beta sent nothing")
	assert.Zero(t, r.Tenants[1].ReqPerSec)

	require.Len(t, r.Refusals, 1)
	assert.Equal(t, "acme", r.Refusals[0].Tenant)
	assert.Equal(t, 404, r.Refusals[0].Status)
	assert.Equal(t, "model_not_found", r.Refusals[0].Code)
	assert.Contains(t, r.Refusals[0].Message, "no-such-model")
	assert.WithinDuration(t, testClock(), r.Refusals[0].At, time.Minute, "the node's clock")

	require.Len(t, r.Replicas, 1)
	assert.Equal(t, "healthy", r.Replicas[0].State)

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(n.adminURL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusFound, resp.StatusCode, "the admin root leads to the status page")
	assert.Equal(t, n.adminURL+"/status", resp.Header.Get("Location"))
	require.NotNil(t, r.Replicas[0].StateSince, "when the replica entered its state")
	assert.GreaterOrEqual(t, r.Replicas[0].StateForS, int64(0))
}

// TestStatusReportScrapeError pins each replica's last scrape error on
// the status page: when, and which of /metrics, /health and /v1/models
// failed with what, and never a credential: not the replica's API key
// (sent as Authorization) nor the userinfo of its URL.
func TestStatusReportScrapeError(t *testing.T) {
	const apiKey = "sk-upstream-very-secret"
	t.Setenv("SLUICE_TEST_UPSTREAM_KEY", apiKey)
	good := startSim(t, sim.DefaultConfig())
	noModels := startSimWrapped(t, sim.DefaultConfig(), func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://ops:hunter2@" + ln.Addr().String() // nothing listens there
	require.NoError(t, ln.Close())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`upstream:
  scrape_interval: 50ms
  replicas:
    - {name: good, url: %q}
    - {name: nomodels, url: %q, api_key_env: SLUICE_TEST_UPSTREAM_KEY}
    - {name: dead, url: %q, api_key_env: SLUICE_TEST_UPSTREAM_KEY}
gpu: {telemetry: off}
server: {drain_timeout: 5s}
admin: {status_token: %q}
tenants:
  - name: acme
    api_keys: [%q]
`, good.url, noModels.url, dead, config.HashKey(statusToken), config.HashKey(keyAcme))))
	require.NoError(t, err)
	n := startNode(t, cfg)

	type scrapeErr struct {
		At      time.Time `json:"at"`
		AgoS    *int64    `json:"ago_s"`
		Current bool      `json:"current"`
		Failed  []struct {
			Endpoint string `json:"endpoint"`
			Message  string `json:"message"`
		} `json:"failed"`
	}
	var body []byte
	var reps map[string]*scrapeErr
	urls := map[string]string{}
	eventually(t, "both failures on the page", func() bool {
		req, err := http.NewRequest(http.MethodGet, n.adminURL+"/status/report.json", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+statusToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		var r struct {
			Replicas []struct {
				Name string     `json:"name"`
				URL  string     `json:"url"`
				Last *scrapeErr `json:"last_scrape_error"`
			} `json:"replicas"`
		}
		require.NoError(t, json.Unmarshal(body, &r))
		reps = map[string]*scrapeErr{}
		for _, x := range r.Replicas {
			reps[x.Name], urls[x.Name] = x.Last, x.URL
		}
		return reps["dead"] != nil && reps["nomodels"] != nil
	})
	assert.Nil(t, reps["good"], "no error: null")
	d := reps["dead"]
	assert.True(t, d.Current)
	assert.WithinDuration(t, testClock(), d.At, time.Minute, "the node's clock")
	require.NotNil(t, d.AgoS)
	require.Len(t, d.Failed, 2, "%+v", d.Failed)
	assert.Equal(t, "/metrics", d.Failed[0].Endpoint)
	assert.Equal(t, "/health", d.Failed[1].Endpoint)
	assert.Contains(t, d.Failed[0].Message, "connection refused")
	m := reps["nomodels"]
	assert.True(t, m.Current)
	require.Len(t, m.Failed, 1, "%+v", m.Failed)
	assert.Equal(t, "/v1/models", m.Failed[0].Endpoint)
	assert.Equal(t, "status 401", m.Failed[0].Message)

	assert.Equal(t, "http://"+strings.TrimPrefix(dead, "http://ops:hunter2@"), urls["dead"], "the URL without its userinfo")
	for _, secret := range []string{apiKey, "hunter2", "ops:", "Bearer"} {
		assert.NotContains(t, string(body), secret, "the status report leaks a credential")
	}
}
