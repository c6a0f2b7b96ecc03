package lifecycle

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/views"
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

// numUsage is the number of usage dimensions: usageDims and cached input.
const numUsage = len(usageDims) + 1

// usageHours is how many hourly buckets a usageKey keeps for GET
// /admin/usage?window= (31 days: a monthly export).
const usageHours = 31 * 24

// usageCounters are one usageKey's counters, resolved once: label hashing
// and the vector's lookup per dimension would otherwise run on every
// settlement. The last is cached input tokens. Besides the Prometheus
// counters they keep the totals and hourly buckets that GET /admin/usage
// reads (Engine.UsageCounts).
type usageCounters struct {
	prom [numUsage]prometheus.Counter

	mu    sync.Mutex // guards the fields below
	total [numUsage]int64
	hours [usageHours]usageHour
}

// usageHour is one hour's usage (hour: Unix hours; 0 unused).
type usageHour struct {
	hour int64
	v    [numUsage]int64
}

func (uc *usageCounters) add(now time.Time, v *[numUsage]int64) {
	h := now.Unix() / 3600
	uc.mu.Lock()
	defer uc.mu.Unlock()
	b := &uc.hours[h%usageHours]
	if b.hour != h {
		*b = usageHour{hour: h}
	}
	for i, x := range v {
		uc.total[i] += x
		b.v[i] += x
	}
}

// countUsage adds a settled call's charge to the usage counters. A call
// that never ran (nothing charged) adds nothing.
func (e *Engine) countUsage(c *call, actual ledger.Amounts) {
	if actual[ledger.Requests] == 0 {
		return
	}
	k := usageKey{tenant: c.t.Name, key: "_unnamed", model: c.req.Model}
	if c.key != nil {
		k.key = c.key.MetricLabel()
	}
	uc, ok := e.usage.Load(k)
	if !ok {
		fresh := &usageCounters{}
		for i, d := range usageDims {
			fresh.prom[i] = e.m.Usage.WithLabelValues(k.tenant, k.key, k.model, d.String())
		}
		fresh.prom[len(usageDims)] = e.m.Usage.WithLabelValues(k.tenant, k.key, k.model, usageCachedInput)
		uc, _ = e.usage.LoadOrStore(k, fresh)
	}
	ctrs := uc.(*usageCounters)
	var add [numUsage]int64
	for i, d := range usageDims {
		if v := actual[d]; v > 0 {
			ctrs.prom[i].Add(float64(v))
			add[i] = v
		}
	}
	if v := c.usage.CachedTokens; v > 0 {
		ctrs.prom[len(usageDims)].Add(float64(v))
		add[len(usageDims)] = int64(v)
	}
	ctrs.add(e.now(), &add)
}

// UsageDimensions are the names of the usage dimensions, in the order of
// GET /admin/usage's CSV columns.
func UsageDimensions() []string {
	out := make([]string, 0, numUsage)
	for _, d := range usageDims {
		out = append(out, d.String())
	}
	return append(out, usageCachedInput)
}

// UsageWindowMax is the longest window [Engine.UsageCounts] counts over.
const UsageWindowMax = usageHours * time.Hour

// UsageCounts copies this process's cumulative usage counters (those
// behind sluice_usage_total): since the process started, or with window > 0
// over the hours from views.FirstHour.
func (e *Engine) UsageCounts(window time.Duration) views.UsageIn {
	now := e.now()
	in := views.UsageIn{Now: now, Started: e.started, Window: window, Dims: UsageDimensions()}
	from := views.FirstHour(now, window)
	e.usage.Range(func(k, v any) bool {
		uk, uc := k.(usageKey), v.(*usageCounters)
		uc.mu.Lock()
		vals := uc.total
		if window > 0 {
			vals = [numUsage]int64{}
			for _, b := range uc.hours {
				if b.hour >= from && b.hour > 0 {
					for i, x := range b.v {
						vals[i] += x
					}
				}
			}
		}
		uc.mu.Unlock()
		in.Counts = append(in.Counts, views.UsageCount{Tenant: uk.tenant, Key: uk.key, Model: uk.model, Values: vals[:]})
		return true
	})
	return in
}
