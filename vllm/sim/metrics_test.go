package sim

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type families map[string]*dto.MetricFamily

func (f families) value(t *testing.T, name string) float64 {
	t.Helper()
	mf, ok := f[name]
	require.True(t, ok, "metric %s missing", name)
	require.NotEmpty(t, mf.GetMetric())
	m := mf.GetMetric()[0]
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s is neither gauge nor counter", name)
	return 0
}

func parseMetrics(t *testing.T, text []byte) families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(text))
	require.NoError(t, err, "metrics text:\n%s", text)
	return mfs
}

func scrapeGatherer(t *testing.T, r *Replica) families {
	t.Helper()
	mfs, err := r.Gatherer().Gather()
	require.NoError(t, err)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		require.NoError(t, enc.Encode(mf))
	}
	return parseMetrics(t, buf.Bytes())
}

func scrapeHTTP(t *testing.T, url string) families {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return parseMetrics(t, b)
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestMetricsNamesAndLabels(t *testing.T) {
	cfg := fastConfig()
	cfg.Model = "m1"
	cfg.KVTokens = 8192
	cfg.BlockSize = 16
	r, url := startReplica(t, cfg)
	resp, _ := post(t, url+"/v1/completions", `{"model":"m1","prompt":"hello world","max_tokens":7,"ignore_eos":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	mf := scrapeHTTP(t, url)
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
		"vllm:request_success_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
		"vllm:e2e_request_latency_seconds", "vllm:cache_config_info",
		"sim_aborted_requests_total", "sim_gpu_busy_seconds_total", "sim_gpu_utilization_ratio",
		"sim_gpu_energy_joules_total", "sim_gpu_power_watts",
	} {
		f, ok := mf[name]
		if !assert.True(t, ok, "missing %s", name) {
			continue
		}
		for _, m := range f.GetMetric() {
			l := labelsOf(m)
			assert.Equal(t, "m1", l["model_name"], name)
			assert.Equal(t, "0", l["engine"], name)
		}
	}
	info := labelsOf(mf["vllm:cache_config_info"].GetMetric()[0])
	assert.Equal(t, "16", info["block_size"])
	assert.Equal(t, "512", info["num_gpu_blocks"])
	assert.InDelta(t, 7.0, mf.value(t, "vllm:generation_tokens_total"), 1e-9)
	assert.InDelta(t, float64(r.Stats().PromptTokens), mf.value(t, "vllm:prompt_tokens_total"), 1e-9)
	var length float64
	for _, m := range mf["vllm:request_success_total"].GetMetric() {
		if labelsOf(m)["finished_reason"] == "length" {
			length = m.GetCounter().GetValue()
		}
	}
	assert.InDelta(t, 1.0, length, 1e-9)
	assert.InDelta(t, r.Stats().BusyTime.Seconds(), mf.value(t, "sim_gpu_busy_seconds_total"), 1e-9)
}

func TestMetricsCompat(t *testing.T) {
	cfg := fastConfig()
	cfg.MetricsCompat = true
	_, url := startReplica(t, cfg)
	mf := scrapeHTTP(t, url)
	assert.Contains(t, mf, "vllm:gpu_cache_usage_perc")
	assert.NotContains(t, mf, "vllm:kv_cache_usage_perc")
	assert.Contains(t, mf, "vllm:time_per_output_token_seconds")
	for _, m := range mf["vllm:request_success_total"].GetMetric() {
		l := labelsOf(m)
		assert.Contains(t, l, "finish_reason")
		assert.NotContains(t, l, "engine")
	}
}
