package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const flood = `
seed: 42
duration: 120s
warmup: 10s
defaults:
  input:  {dist: uniform, mean: 1024, range_ratio: 0.25}
  output: {dist: uniform, mean: 128,  range_ratio: 0.25}
  arrival: {burstiness: 1.0}
  deadline: 30s
  slo: {ttft_ms: 2000, tpot_ms: 100}
tenants:
  - {name: chat-a, api_key: "${KEY_A}", weight: 1, rate: 2.0}
  - {name: chat-b, api_key: "k-b", weight: 1, rate: 2.0, slo: {ttft_ms: 1000}}
  - {name: batch,  api_key: "k-c", weight: 2, rate: 2.0, deadline: 120s}
  - {name: flood, api_key: "k-f", role: aggressor, weight: 1, rate: 20,
     arrival: {burstiness: 0.25}, pattern: {type: on_off, on: 30s, off: 30s, phase: 15s}}
`

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseYAMLAndDefaults(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(flood), lookup(map[string]string{"KEY_A": "sk-a"}))
	require.NoError(t, err)
	plans, err := s.Plans(Options{})
	require.NoError(t, err)
	require.Len(t, plans, 4)
	assert.Equal(t, "sk-a", plans[0].APIKey)
	assert.Equal(t, 30*time.Second, plans[0].Deadline)
	assert.Equal(t, 120*time.Second, plans[2].Deadline)
	assert.InDelta(t, 2000.0, *plans[0].SLO.TTFTMs, 0)
	assert.InDelta(t, 1000.0, *plans[1].SLO.TTFTMs, 0, "tenant SLO overrides key by key")
	assert.InDelta(t, 100.0, *plans[1].SLO.TPOTMs, 0, "unset SLO keys inherit")
	assert.InDelta(t, 0.25, plans[3].Burstiness, 0)
	assert.Equal(t, "aggressor", plans[3].Role)
	assert.Equal(t, "victim", plans[0].Role)
	assert.Equal(t, Cost{Input: 1, Output: 2}, plans[0].Cost)
}

func TestParseJSONUnknownField(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte(`{"seed":1,"tenants":[{"name":"a","rate":1,"bogus":2}]}`), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bogus")
	_, err = Parse([]byte("seed: 1\ntenants:\n  - {name: a, rate: 1, bogus: 2}\n"), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bogus")
	s, err := Parse([]byte(`{"seed":1,"tenants":[{"name":"a","rate":"3x","input":{"dist":"fixed","value":5},"output":{"dist":"fixed","value":2}}]}`), nil)
	require.NoError(t, err)
	_, err = s.Plans(Options{})
	require.ErrorContains(t, err, "needs --capacity")
	p, err := s.Plans(Options{Capacity: 2})
	require.NoError(t, err)
	assert.InDelta(t, 6.0, p[0].Rate, 1e-12)
}

func TestValidateNamesEveryField(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`
tenants:
  - {name: a, rate: 0, weight: -1, input: {dist: zipf}, output: {dist: fixed, value: 0}}
  - {name: a, rate: 1, role: boss, cancel: {fraction: 2}, pattern: {type: wave}}
`), nil)
	require.NoError(t, err)
	err = s.Validate()
	require.Error(t, err)
	for _, want := range []string{
		"tenants[0].weight must be > 0", "tenants[0].rate must be > 0", `tenants[0].input.dist "zipf" unknown`,
		"tenants[0].output.value must be >= 1", `tenants[1].name "a" is duplicated`, `tenants[1].role "boss" unknown`,
		"tenants[1].cancel.fraction must be in [0, 1]", `tenants[1].pattern.type "wave" unknown`,
	} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestGammaMoments(t *testing.T) {
	t.Parallel()
	for _, k := range []float64{0.25, 0.5, 1, 4} {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(1, 2))
			const n = 100_000
			var sum, sq float64
			for range n {
				x := Gamma(r, k, 2)
				sum += x
				sq += x * x
			}
			mean := sum / n
			sd := math.Sqrt(sq/n - mean*mean)
			assert.InEpsilon(t, 2*k, mean, 0.02, "mean")
			assert.InEpsilon(t, 1/math.Sqrt(k), sd/mean, 0.02, "cv")
		})
	}
}

// TestArrivalRateAndCV checks the schedule itself: 100,000 inter-arrivals
// have mean 1/rate and CV 1/√k within 2 %.
func TestArrivalRateAndCV(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		rate  float64
		burst float64
	}{{"poisson", 8, 1}, {"bursty", 20, 0.25}, {"smooth", 3, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := Rate{Value: tc.burst}
			n := 100_001
			s := &Spec{Seed: 7, Defaults: Tenant{Input: &Length{Dist: "fixed", Value: 8}, Output: &Length{Dist: "fixed", Value: 4},
				Arrival: &Arrival{Burstiness: &b}},
				Tenants: []Tenant{{Name: "t", Rate: &Rate{Value: tc.rate}, NumPrompts: &n}}}
			sc, err := Build(s, Options{})
			require.NoError(t, err)
			require.Len(t, sc.Requests, n)
			var sum, sq float64
			for i := 1; i < n; i++ {
				g := (sc.Requests[i].At - sc.Requests[i-1].At).Seconds()
				sum += g
				sq += g * g
			}
			m := float64(n - 1)
			mean := sum / m
			cv := math.Sqrt(sq/m-mean*mean) / mean
			assert.InEpsilon(t, 1/tc.rate, mean, 0.02, "mean gap")
			assert.InEpsilon(t, 1/math.Sqrt(tc.burst), cv, 0.02, "cv")
		})
	}
}

func fingerprint(sc *Schedule, name string) string {
	var b strings.Builder
	for _, r := range sc.Requests {
		if sc.Tenants[r.Tenant].Name == name {
			fmt.Fprintf(&b, "%d %d %d %d %d %d\n", r.N, r.At, r.InputLen, r.OutputLen, r.PromptSeed, r.CancelAfter)
		}
	}
	return b.String()
}

func TestRemovingTenantLeavesOthersIdentical(t *testing.T) {
	t.Parallel()
	full, err := Parse([]byte(flood), lookup(nil))
	require.NoError(t, err)
	base, err := Build(full, Options{})
	require.NoError(t, err)

	excluded, err := Build(full, Options{Exclude: []string{"flood"}})
	require.NoError(t, err)

	removed, err := Parse([]byte(flood), lookup(nil))
	require.NoError(t, err)
	removed.Tenants = removed.Tenants[:3]
	without, err := Build(removed, Options{})
	require.NoError(t, err)

	rerated, err := Parse([]byte(flood), lookup(nil))
	require.NoError(t, err)
	rerated.Tenants[3].Rate = &Rate{Value: 50}
	fast, err := Build(rerated, Options{})
	require.NoError(t, err)

	assert.Empty(t, fingerprint(excluded, "flood"))
	assert.NotEqual(t, fingerprint(base, "flood"), fingerprint(fast, "flood"))
	for _, v := range []string{"chat-a", "chat-b", "batch"} {
		want := fingerprint(base, v)
		require.NotEmpty(t, want)
		assert.Equal(t, want, fingerprint(excluded, v), v)
		assert.Equal(t, want, fingerprint(without, v), v)
		assert.Equal(t, want, fingerprint(fast, v), v)
	}
	again, err := Build(full, Options{})
	require.NoError(t, err)
	assert.Equal(t, base.Requests, again.Requests, "same seed, same schedule")
}

func TestPatternsAndLengths(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(flood), lookup(nil))
	require.NoError(t, err)
	sc, err := Build(s, Options{})
	require.NoError(t, err)
	prev := time.Duration(-1)
	for _, r := range sc.Requests {
		require.GreaterOrEqual(t, r.At, prev, "sorted")
		prev = r.At
		require.Less(t, r.At, 120*time.Second)
		assert.GreaterOrEqual(t, r.InputLen, 768)
		assert.LessOrEqual(t, r.InputLen, 1280)
		if sc.Tenants[r.Tenant].Name == "flood" {
			// on 30 s, off 30 s, phase 15 s: on during [0,15) [45,75) [105,120).
			pos := (r.At + 15*time.Second) % (60 * time.Second)
			assert.Less(t, pos, 30*time.Second, "flood arrival at %v is in an off period", r.At)
		}
	}
	inf := 200
	s2 := &Spec{Defaults: Tenant{Input: &Length{Dist: "fixed", Value: 8}, Output: &Length{Dist: "fixed", Value: 4}},
		Tenants: []Tenant{{Name: "burst", Rate: &Rate{Value: math.Inf(1)}, NumPrompts: &inf}}}
	sc2, err := Build(s2, Options{Duration: time.Minute})
	require.NoError(t, err)
	require.Len(t, sc2.Requests, 200)
	assert.Equal(t, time.Duration(0), sc2.Requests[199].At)
}

func TestRampThins(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`
seed: 3
duration: 1000s
defaults: {input: {dist: fixed, value: 4}, output: {dist: fixed, value: 4}}
tenants:
  - {name: r, pattern: {type: ramp, from: 0, to: 10}}
`), nil)
	require.NoError(t, err)
	sc, err := Build(s, Options{})
	require.NoError(t, err)
	first, second := 0, 0
	for _, r := range sc.Requests {
		if r.At < 500*time.Second {
			first++
		} else {
			second++
		}
	}
	// Expected 1250 and 3750 (integral of the ramp); allow 5 σ.
	assert.InDelta(t, 1250, first, 5*math.Sqrt(1250))
	assert.InDelta(t, 3750, second, 5*math.Sqrt(3750))
}

func TestLengthDraws(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 1))
	u := Length{Dist: "uniform", Mean: 10, RangeRatio: 0.5}
	seen := map[int]bool{}
	for range 10_000 {
		seen[u.Draw(r)] = true
	}
	assert.Len(t, seen, 11, "5..15 inclusive, as vLLM's random dataset")
	assert.True(t, seen[5] && seen[15])
	c := Length{Dist: "normal", Mean: 10, Stddev: 100, Min: 3, Max: 20}
	for range 1000 {
		v := c.Draw(r)
		require.True(t, v >= 3 && v <= 20, "clipped: %d", v)
	}
	first := PromptTokens(5, 1, 16)
	assert.Equal(t, first, PromptTokens(5, 1, 16), "same seed and salt, same content")
	assert.NotEqual(t, PromptTokens(5, 1, 16), PromptTokens(5, 2, 16), "salt changes content")
}

func TestDataset(t *testing.T) {
	t.Parallel()
	d, err := ParseDataset([]byte(`{"prompt":"hello there world","output_len":5}
{"prompt_ids":[1,2,3],"output_len":2,"tenant":"b"}

{"prompt":"x","prompt_ids":[1],"output_len":1}
{"prompt":"y","output_len":0}
{"prompt":"z","output_len":1,"extra":true}
`))
	require.Error(t, err)
	for _, want := range []string{"line 4: exactly one of prompt and prompt_ids", "line 5: output_len must be >= 1", `line 6: json: unknown field "extra"`} {
		assert.Contains(t, err.Error(), want)
	}
	require.Len(t, d, 2)
	assert.Equal(t, 5, d[0].InputLen(), "17 bytes ≈ 5 tokens")
	assert.Equal(t, 3, d[1].InputLen())
	n := 50
	s := &Spec{Seed: 1, Defaults: Tenant{Input: &Length{Dist: "fixed", Value: 8}, Output: &Length{Dist: "fixed", Value: 4}, NumPrompts: &n},
		Tenants: []Tenant{{Name: "a", Rate: &Rate{Value: 10}}, {Name: "b", Rate: &Rate{Value: 10}}}}
	sc, err := Build(s, Options{Dataset: d})
	require.NoError(t, err)
	for _, r := range sc.Requests {
		require.Positive(t, r.Entry)
		e := sc.Dataset[r.Entry-1]
		assert.True(t, e.Tenant == "" || e.Tenant == sc.Tenants[r.Tenant].Name)
		assert.Equal(t, e.OutputLen, r.OutputLen)
		assert.Equal(t, e.InputLen(), r.InputLen)
		if sc.Tenants[r.Tenant].Name == "a" {
			assert.Equal(t, 1, r.Entry, "tenant a only sees the untagged entry")
		}
	}
	_, err = Build(s, Options{Dataset: d[1:]})
	assert.ErrorContains(t, err, `dataset has no entry for tenant "a"`)
}
