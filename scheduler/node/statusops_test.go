package node

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	assert.WithinDuration(t, time.Now(), r.Refusals[0].At, time.Minute)

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
