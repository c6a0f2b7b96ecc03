package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// floodResult is what one streamed flood request's client saw.
type floodResult struct {
	status     int
	done       bool  // the stream ended with [DONE]
	completion int64 // usage.completion_tokens of its last chunk
	total      int64 // usage.total_tokens
}

// streamUsage sends one streamed completion asking for usage and reads it
// to its end.
func (n *node) streamUsage(key, body string) floodResult {
	req, _ := http.NewRequest("POST", n.api+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return floodResult{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := floodResult{status: resp.StatusCode}
	for _, ev := range sseEvents(raw) {
		if ev == "[DONE]" {
			r.done = true
			continue
		}
		var c struct {
			Usage *struct {
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(ev), &c) == nil && c.Usage != nil {
			r.completion, r.total = c.Usage.Completion, c.Usage.Total
		}
	}
	return r
}

// TestTakeBackFromVLLMQueue: a batch job's burst of 24 streamed requests
// over a replica whose batch is 8, max_num_seqs left out and the default
// scrape cadences (so the ramp is on), while a light tenant sends a
// request every 100 ms. The ramp overfills the unlearned replica by at
// most its step, and the scrape that confirms the batch takes back what
// waits inside vLLM (SCHEDULING §7, "Taking back"). What the test holds
// is the accounting of a take-back end to end: every flood request is
// answered in full, once; vLLM aborted exactly the attempts taken back;
// the ledger charged each request once, what its client was told; and
// from the take-back on nothing stands in vLLM's queue.
func TestTakeBackFromVLLMQueue(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxNumSeqs, sc.DecodeStep = 8, 10*time.Millisecond
	rep := startSim(t, sc)
	cfg := nodeConfig(t, []*simReplica{rep},
		"    queue: {max_wait: 60s}\n    budgets:\n      - {dimension: tokens, limit: 100000000, window: 1h}\n      - {dimension: requests, limit: 100000, window: 1h}\n", "")
	cfg.Upstream.ScrapeInterval = time.Second // the defaults: the learning scrape, so the ramp
	require.Less(t, cfg.Upstream.LearnScrapeInterval, cfg.Upstream.ScrapeInterval)
	n := startNode(t, cfg)

	const floods, floodTokens = 24, 100
	light := `{"model":"sim-model","prompt":"hi","max_tokens":4,"ignore_eos":true,"stream":true}`
	flood := `{"model":"sim-model","prompt":"batch job","max_tokens":100,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`

	ctx, stopLight := context.WithCancel(context.Background())
	var lightMu sync.Mutex
	var lightTTFT []time.Duration
	lightDone := make(chan struct{})
	go func() {
		defer close(lightDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			d := n.ttftOf(t, keyBeta, light)
			lightMu.Lock()
			lightTTFT = append(lightTTFT, d)
			lightMu.Unlock()
		}
	}()
	defer func() { stopLight(); <-lightDone }()
	eventually(t, "the light tenant ran alone", func() bool {
		lightMu.Lock()
		defer lightMu.Unlock()
		return len(lightTTFT) >= 10
	})

	results := make([]floodResult, floods)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = n.streamUsage(keyAcme, flood) })
	}
	taken := func() float64 {
		return n.metric(t, "sluice_upstream_aborts_total", map[string]string{"replica": "r0", "cause": "taken_back"})
	}
	eventually(t, "a take-back", func() bool { return taken() > 0 })
	// vLLM drops an aborted waiting request at its next step.
	eventually(t, "vLLM's queue emptied", func() bool { return rep.Stats().Waiting == 0 })
	stop := sampleWaiting(rep)
	wg.Wait()
	most, mean := stop()
	stopLight()
	<-lightDone

	var sumTotal int64
	for i, r := range results {
		require.Equalf(t, 200, r.status, "flood request %d", i)
		require.Truef(t, r.done, "flood request %d ended with [DONE]", i)
		require.EqualValuesf(t, floodTokens, r.completion, "flood request %d's usage", i)
		sumTotal += r.total
	}
	k := taken()
	t.Logf("taken back %v; vLLM waiting once it dropped them: mean %.3f most %d", k, mean, most)
	// vLLM aborted exactly the attempts taken back, and none of the
	// light tenant's; each request's answer came from one attempt.
	eventually(t, "vLLM counted its aborts", func() bool { return rep.Stats().Aborted == int64(k) })
	st := rep.Stats()
	lightMu.Lock()
	lights := slices.Clone(lightTTFT)
	lightMu.Unlock()
	assert.EqualValues(t, floods+len(lights), st.Completed, "every request completed once upstream")
	// The ledger charged each flood request once, what its client was told.
	eventually(t, "the flood settled", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) == floods
	})
	assert.EqualValues(t, sumTotal, n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}))
	assert.Zero(t, n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme"}), "nothing stays reserved")
	// The confirmed batch is the stop from then on: the flood waits in
	// Sluice's queue, not vLLM's.
	assert.Less(t, mean, 0.05, "nothing stands in vLLM's queue after the take-back")

	slices.Sort(lights)
	t.Logf("light TTFT over the whole run (%d): p50 %v p90 %v max %v", len(lights), lights[len(lights)/2], lights[len(lights)*9/10], lights[len(lights)-1])
}
