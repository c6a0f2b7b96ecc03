package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// chatAnswer is the part of a chat answer these tests read.
type chatAnswer struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// chatBurst sends n concurrent chats without max_tokens and returns how many
// were served, how many of those were cut (finish_reason length or
// X-Sluice-Stopped), and the statuses of the others.
func chatBurst(t *testing.T, nd *node, n int, stream bool) (served, cut int, refused map[int]int) {
	t.Helper()
	var mu sync.Mutex
	refused = map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"question %d"}],"stream":%t}`, i, stream)
			r := nd.call(t, chatPath, keyAcme, body)
			mu.Lock()
			defer mu.Unlock()
			if r.StatusCode != http.StatusOK {
				refused[r.StatusCode]++
				return
			}
			served++
			finish := ""
			if stream {
				for _, ev := range sseEvents(r.Body) {
					if strings.Contains(ev, `"finish_reason":"`) {
						finish = ev[strings.Index(ev, `"finish_reason":"`)+17:]
						finish = finish[:strings.IndexByte(finish, '"')]
					}
				}
			} else {
				var a chatAnswer
				if err := json.Unmarshal(r.Body, &a); err != nil || len(a.Choices) != 1 {
					t.Errorf("answer %s: %v", r.Body, err)
					return
				}
				finish = a.Choices[0].FinishReason
			}
			if finish != "stop" || r.Header.Get("X-Sluice-Stopped") != "" {
				cut++
			}
		})
	}
	wg.Wait()
	return served, cut, refused
}

// predictNode is budgetNode with top-level config lines.
func predictNode(t *testing.T, mml int, acmeExtra, top string) *node {
	t.Helper()
	sc := sim.DefaultConfig()
	sc.MaxModelLen = mml
	sc.KVTokens = 1 << 17
	sc.DecodeStep = 50 * time.Microsecond
	sc.PrefillTPS = 1e9
	rep := startSim(t, sc)
	return startNode(t, nodeConfig(t, []*simReplica{rep}, acmeExtra, top))
}

// A tenant with 20,000 tokens an hour sending 40 concurrent chats without
// max_tokens (natural answers ≤ 128 tokens) is served, untruncated: each
// holds its input plus a predicted output, not the rest of the context.
// With worst-case holds most are refused.
func TestBurstWithoutMaxTokensIsServedOnPredictedHolds(t *testing.T) {
	const budget = "    budgets: [{dimension: tokens, limit: 20000, window: 1h}]\n"
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			n, _ := budgetNode(t, 8192, budget)
			served, cut, refused := chatBurst(t, n, 40, stream)
			t.Logf("predicted holds, stream=%t: %d of 40 served, %d cut, refused %v", stream, served, cut, refused)
			assert.GreaterOrEqual(t, served, 38, "refused: %v", refused)
			assert.Zero(t, cut, "no natural answer truncated")
		})
	}
	t.Run("worst-case holds", func(t *testing.T) {
		n := predictNode(t, 8192, budget, "server: {drain_timeout: 5s, hold_prediction: {enabled: false}}\n")
		served, _, refused := chatBurst(t, n, 40, false)
		t.Logf("worst-case holds: %d of 40 served, refused %v", served, refused)
		// Each holds the rest of the context, so only a few fit at once;
		// how many more are admitted as earlier ones finish follows the
		// machine's speed (7–10 seen), so the assertion is the goal it
		// misses, not a count.
		assert.Less(t, served, 38, "each holds the rest of the context: %v", refused)
	})
}

// A tenant whose requests never stop (ignore_eos, no max_tokens) uses its
// budget and passes it by at most one step per running request: each
// hold grows by a step as it generates, and the generation a budget cannot
// cover is stopped (finish_reason length, the final chunk's "sluice"
// member, X-Sluice-Stopped without a stream) and charged what ran.
func TestRunawayRequestsAreStoppedAtTheBudget(t *testing.T) {
	t.Run("memory", func(t *testing.T) { runaway(t, "") })
	t.Run("redis", func(t *testing.T) {
		rds := startRedis(t)
		runaway(t, fmt.Sprintf("ledger: {backend: redis, redis: {addrs: [%q], store_timeout: 5s}}\n", rds.addr))
	})
}

func runaway(t *testing.T, top string) {
	const limit, step, running = 20000, 256, 4
	n := predictNode(t, 8192, fmt.Sprintf("    budgets: [{dimension: tokens, limit: %d, window: 1h}]\n", limit), top)
	var wg sync.WaitGroup
	var mu sync.Mutex
	stopped, other := 0, map[int]int{}
	for i := range running {
		wg.Go(func() {
			stream := i%2 == 0
			body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"never stop %d"}],"ignore_eos":true,"stream":%t}`, i, stream)
			r := n.call(t, chatPath, keyAcme, body)
			mu.Lock()
			defer mu.Unlock()
			if r.StatusCode != http.StatusOK {
				other[r.StatusCode]++
				return
			}
			if stream {
				evs := sseEvents(r.Body)
				require.GreaterOrEqual(t, len(evs), 2)
				assert.Equal(t, "[DONE]", evs[len(evs)-1])
				last := evs[len(evs)-2]
				assert.Contains(t, last, `"finish_reason":"length"`)
				assert.Contains(t, last, `"sluice":{"stopped":"budget","scope":"tenant","dimension":"tokens","window":"1h"}`)
			} else {
				var a chatAnswer
				require.NoError(t, json.Unmarshal(r.Body, &a), "%s", r.Body)
				require.Len(t, a.Choices, 1)
				assert.Equal(t, "length", a.Choices[0].FinishReason)
				assert.Equal(t, "budget; scope=tenant; dimension=tokens; window=1h", r.Header.Get("X-Sluice-Stopped"))
			}
			stopped++
		})
	}
	wg.Wait()
	assert.Equal(t, running, stopped, "every runaway stopped at the budget: %v", other)
	var committed float64
	eventually(t, "settled", func() bool {
		committed = n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"})
		return committed > 0 && n.metric(t, "sluice_inflight_requests", map[string]string{"tenant": "acme"}) == 0
	})
	t.Logf("committed %.0f of %d", committed, limit)
	assert.GreaterOrEqual(t, committed, 0.75*limit, "the budget is used")
	assert.LessOrEqual(t, committed, float64(limit+step*running), "passed by at most one step per running request")
	assert.LessOrEqual(t, committed, 1.10*limit)
	// What is left (under a step) goes to the next request, lowered to fit
	// (X-Sluice-Output-Cap) or refused; never past the bound.
	r := n.call(t, chatPath, keyAcme, `{"model":"sim-model","messages":[{"role":"user","content":"more"}],"ignore_eos":true}`)
	if r.StatusCode == http.StatusOK {
		assert.Contains(t, r.Header.Get("X-Sluice-Output-Cap"), "reason=budget")
	} else {
		assert.Equal(t, http.StatusTooManyRequests, r.StatusCode, "%s", r.Body)
	}
	eventually(t, "settled", func() bool {
		return n.metric(t, "sluice_inflight_requests", map[string]string{"tenant": "acme"}) == 0
	})
	assert.LessOrEqual(t, n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}), float64(limit+step*running))
}

// holdRatios reads an audit trail: per settled request, the tokens held at
// admission and at settlement (a grown hold) over the tokens charged.
func holdRatios(t *testing.T, path string) (admitted, final []float64) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	held := map[string]int64{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		var rec struct {
			Kind          string `json:"kind"`
			RequestID     string `json:"request_id"`
			TokensHeld    int64  `json:"tokens_held"`
			TokensCharged int64  `json:"tokens_charged"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.RequestID == "" {
			continue
		}
		switch rec.Kind {
		case "admit":
			held[rec.RequestID] = rec.TokensHeld
		case "settle":
			if h, ok := held[rec.RequestID]; ok && rec.TokensCharged > 0 {
				admitted = append(admitted, float64(h)/float64(rec.TokensCharged))
				final = append(final, float64(rec.TokensHeld)/float64(rec.TokensCharged))
			}
		}
	}
	return admitted, final
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// An agent-like workload (conversations whose context grows turn by turn,
// no max_tokens, answers of 1..400 tokens, streamed and not) holds close to
// what it uses: holds ÷ tokens settled ≤ 1.5 at the median, where
// worst-case holds (the rest of the context) are several times it.
// BENCHMARKS.md records the figures: go test -v -run
// TestAgentLikeHoldsFollowUse ./scheduler/node/
func TestAgentLikeHoldsFollowUse(t *testing.T) {
	run := func(t *testing.T, top string) (admitted, final []float64) {
		sc := sim.DefaultConfig()
		sc.MaxModelLen = 16384
		sc.KVTokens = 1 << 20
		sc.DecodeStep = 20 * time.Microsecond
		sc.PrefillTPS = 1e9
		sc.OutputLenMax = 400
		rep := startSim(t, sc)
		cfg := nodeConfig(t, []*simReplica{rep}, "", top)
		path := filepath.Join(t.TempDir(), "audit.log")
		cfg.Audit.Path = path
		n := startNode(t, cfg)
		const conversations, turns = 12, 8
		var wg sync.WaitGroup
		for conv := range conversations {
			wg.Go(func() {
				history := fmt.Sprintf(`{"role":"system","content":%q}`, strings.Repeat("You are an agent with tools. ", 40))
				for turn := range turns {
					history += fmt.Sprintf(`,{"role":"user","content":%q}`, strings.Repeat(fmt.Sprintf("step %d of task %d; ", turn, conv), 30))
					body := fmt.Sprintf(`{"model":"sim-model","messages":[%s],"stream":%t}`, history, (conv+turn)%2 == 0)
					r := n.call(t, chatPath, keyAcme, body)
					if r.StatusCode != http.StatusOK {
						t.Errorf("conversation %d turn %d: %d %s", conv, turn, r.StatusCode, r.Body)
						return
					}
					history += `,{"role":"assistant","content":"done"}`
				}
			})
		}
		wg.Wait()
		require.NoError(t, n.stop()) // flushes the audit trail
		return holdRatios(t, path)
	}
	adm, fin := run(t, "")
	wAdm, _ := run(t, "server: {drain_timeout: 5s, hold_prediction: {enabled: false}}\n")
	t.Logf("holds ÷ tokens settled, median over %d requests: predicted %.2f at admission, %.2f grown; worst case %.2f (%d requests)",
		len(adm), median(adm), median(fin), median(wAdm), len(wAdm))
	require.Len(t, adm, 96)
	assert.LessOrEqual(t, median(adm), 1.5)
	assert.LessOrEqual(t, median(fin), 1.5)
	assert.Greater(t, median(wAdm), 2.0, "worst-case holds are the rest of the context")
}
