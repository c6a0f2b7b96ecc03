package scheduler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ledger"
)

// Cumulative usage, whether or not a budget exists: every settled request
// adds what it was charged to sluice_usage_total{tenant,key,model,dimension}.
// The ledger's committed gauges show a budget's current window only (and
// nothing without a budget); these counters are the chargeback view,
// summed over any range with increase() in PromQL. Labels are bounded:
// tenants and key names come from config, models from what the replicas
// serve (an unknown model is refused before admission).

// usageDims are the dimensions counted, with the ledger's names; cached
// input tokens (a subset of input) are counted besides.
var usageDims = [...]ledger.Dim{ledger.Requests, ledger.InputTokens, ledger.OutputTokens, ledger.GPUMs, ledger.GPUJoules, ledger.USDMicros}

const usageCachedInput = "cached_input_tokens"

func newUsageCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_usage_total",
		Help: "Usage charged to settled requests, cumulative, by tenant, API key name (_unnamed for unnamed keys), model and dimension (requests, input_tokens, cached_input_tokens, output_tokens, gpu_ms, gpu_joules in millijoules, usd_micros); counted with or without a budget."},
		[]string{"tenant", "key", "model", "dimension"})
}

// usageKey names one tenant, key and model's usage counters.
type usageKey struct{ tenant, key, model string }

// usageCounters are one usageKey's counters, resolved once: label hashing
// and the vector's lookup per dimension would otherwise run on every
// settlement. The last is cached input tokens.
type usageCounters [len(usageDims) + 1]prometheus.Counter

// countUsage adds a settled call's charge to the usage counters. A call
// that never ran (nothing charged) adds nothing.
func (s *Server) countUsage(c *call, actual ledger.Amounts) {
	if actual[ledger.Requests] == 0 {
		return
	}
	k := usageKey{tenant: c.t.name, key: "_unnamed", model: c.req.Model}
	if c.key != nil {
		k.key = c.key.metricLabel()
	}
	uc, ok := s.usage.Load(k)
	if !ok {
		var fresh usageCounters
		for i, d := range usageDims {
			fresh[i] = s.m.Usage.WithLabelValues(k.tenant, k.key, k.model, d.String())
		}
		fresh[len(usageDims)] = s.m.Usage.WithLabelValues(k.tenant, k.key, k.model, usageCachedInput)
		uc, _ = s.usage.LoadOrStore(k, &fresh)
	}
	ctrs := uc.(*usageCounters)
	for i, d := range usageDims {
		if v := actual[d]; v > 0 {
			ctrs[i].Add(float64(v))
		}
	}
	if v := c.usage.CachedTokens; v > 0 {
		ctrs[len(usageDims)].Add(float64(v))
	}
}
