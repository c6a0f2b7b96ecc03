package scenarios

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bench/workload"
)

func TestPresetsBuild(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []string{"budget-burst", "disconnect-storm", "flood", "overhead", "overload", "saturation"}, Names())
	for _, n := range Names() {
		t.Run(n, func(t *testing.T) {
			t.Parallel()
			b, err := Get(n)
			require.NoError(t, err)
			s, err := workload.Parse(b, func(string) (string, bool) { return "k", true })
			require.NoError(t, err)
			require.NoError(t, s.Validate())
			sc, err := workload.Build(s, workload.Options{Capacity: 4})
			require.NoError(t, err)
			assert.NotEmpty(t, sc.Requests)
		})
	}
	_, err := Get("nope")
	assert.ErrorContains(t, err, "no preset")
}

func TestFloodRates(t *testing.T) {
	t.Parallel()
	b, err := Get("flood")
	require.NoError(t, err)
	s, err := workload.Parse(b, nil)
	require.NoError(t, err)
	p, err := s.Plans(workload.Options{Capacity: 5})
	require.NoError(t, err)
	require.Len(t, p, 4)
	assert.InDelta(t, 1.0, p[0].Rate, 1e-9)
	assert.InDelta(t, 10.0, p[3].Rate, 1e-9, "aggressor at 10× a victim")
	assert.Equal(t, "aggressor", p[3].Role)
}
