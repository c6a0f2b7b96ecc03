// Package promsum reads one figure out of a Prometheus registry: the sum of
// a metric's samples whose labels include a given set. Tests use it to
// assert exact counts and balances.
package promsum

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sum adds the samples of name in g whose labels include want: counter and
// gauge values, and the observation count of histograms.
func Sum(g prometheus.Gatherer, name string, want map[string]string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, nil
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
