package fleet

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fourReplicas() (*Set, []*Replica) {
	var reps []*Replica
	k := map[string]int64{}
	for _, n := range []string{"a", "b", "c", "d"} {
		reps = append(reps, rep(n, 1000))
		k[n] = 100_000
	}
	return newSet(fixedCapacity(k), reps...), reps
}

func TestPrefixHashes(t *testing.T) {
	t.Parallel()
	a := PrefixHashes(nil, []byte(strings.Repeat("x", 150)))
	require.Len(t, a, 2, "only full chunks")
	b := PrefixHashes(nil, []byte(strings.Repeat("x", 128)+"y"))
	assert.Equal(t, a, b)
	c := PrefixHashes(nil, []byte("y"+strings.Repeat("x", 127)))
	assert.NotEqual(t, a[1], c[1], "chained: a chunk's hash covers its prefix")
}

func TestAffinityFollowsPrefix(t *testing.T) {
	t.Parallel()
	set, _ := fourReplicas()
	conv := func(i int) Route {
		return Route{Prefix: PrefixHashes(nil, []byte(strings.Repeat(string(rune('a'+i)), 1024)))}
	}
	// Four conversations spread by least load, then each turn returns to
	// the replica of its conversation.
	home := map[int]*Replica{}
	for i := range 4 {
		r := set.choose(conv(i), 100, nil)
		require.NotNil(t, r)
		home[i] = r
		set.Release(r, 100)
	}
	assert.Len(t, map[*Replica]bool{home[0]: true, home[1]: true, home[2]: true, home[3]: true}, 4, "new prefixes go by least load")
	for range 3 {
		for i := range 4 {
			r := set.choose(conv(i), 100, nil)
			assert.Equal(t, home[i], r, "conversation %d", i)
		}
	}
}

func TestAffinityHotPrefixSpreads(t *testing.T) {
	t.Parallel()
	set, reps := fourReplicas()
	hot := Route{Prefix: PrefixHashes(nil, []byte(strings.Repeat("s", 4096)))}
	for range 200 {
		require.NotNil(t, set.choose(hot, 1000, nil)) // none released: all in flight
	}
	var sum, most int64
	for _, r := range reps {
		sum += r.Load.Load()
		most = max(most, r.Load.Load())
	}
	mean := float64(sum) / 4
	assert.LessOrEqual(t, float64(most), maxOverMean*mean+loadSlack*1000, "one hot prefix may not pile onto one replica")
	assert.Less(t, float64(most), 1.35*mean)
}

func TestLeastLoadWithoutPrefix(t *testing.T) {
	t.Parallel()
	set, reps := fourReplicas()
	for range 8 {
		require.NotNil(t, set.choose(Route{}, 100, nil))
	}
	for _, r := range reps {
		assert.Equal(t, int64(200), r.Load.Load())
	}
}

// BenchmarkChoose is one replica choice (choose + release) on 4 replicas,
// by least load and by affinity with a 4 KiB prompt (64 chunk hashes).
func BenchmarkChoose(b *testing.B) {
	prompt := PrefixHashes(nil, []byte(strings.Repeat("s", 4096)))
	for _, tc := range []struct {
		name string
		rt   Route
	}{{"least_load", Route{}}, {"affinity", Route{Prefix: prompt}}} {
		b.Run(tc.name, func(b *testing.B) {
			set, _ := fourReplicas()
			b.ReportAllocs()
			for b.Loop() {
				r := set.choose(tc.rt, 100, nil)
				set.Release(r, 100)
			}
		})
	}
}

// BenchmarkPrefixHashes hashes a 4 KiB prompt.
func BenchmarkPrefixHashes(b *testing.B) {
	p := []byte(strings.Repeat("s", 4096))
	b.ReportAllocs()
	for b.Loop() {
		PrefixHashes(nil, p)
	}
}
