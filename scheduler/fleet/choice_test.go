package fleet

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplicaChoice: the least normalized load among replicas with room,
// room being tokens and batch slots with the scrape's other sequences.
func TestReplicaChoice(t *testing.T) {
	t.Parallel()
	r0 := &Replica{Name: "r0", MaxSeqs: 4}
	r1 := &Replica{Name: "r1", MaxSeqs: 4}
	set := newSet(fixedCapacity(map[string]int64{"r0": 1000, "r1": 500}), r0, r1)

	// Least normalized load: r0 twice as big gets two for r1's one.
	for range 3 {
		require.NotNil(t, set.choose(Route{}, 100, nil))
	}
	assert.Equal(t, int64(200), r0.Load.Load())
	assert.Equal(t, int64(100), r1.Load.Load())

	// Sequences vLLM runs beyond this instance's own (ghosts, another
	// instance's) fill r1's batch.
	scrapeShows(r1, r1.Count.Load()+4, time.Now())
	assert.Nil(t, set.choose(Route{}, 10, r0), "r1 holds 1 of ours and 4 others")
	assert.Equal(t, r0, set.choose(Route{}, 10, nil))
	r1.Obs.Store(nil)
	r1.batch.scr.Store(nil)

	// Room is tokens and batch slots; the fair-share reserve is the
	// dispatch gate's, not the replica choice's.
	assert.Nil(t, set.choose(Route{}, 800, nil), "210+800 > 1000 and 100+800 > 500")
	assert.True(t, set.Fits(Route{}, 790), "210+790 = 1000 fits")
	assert.Equal(t, int64(210), r0.Load.Load(), "fits reserves nothing")
	assert.Nil(t, set.choose(Route{}, 2000, nil), "fits nowhere")

	r2 := &Replica{Name: "r2", MaxSeqs: 10}
	seqSet := newSet(fixedCapacity(map[string]int64{"r2": 1 << 20}), r2)
	for range 10 {
		require.NotNil(t, seqSet.choose(Route{}, 1, nil))
	}
	assert.Nil(t, seqSet.choose(Route{}, 1, nil), "the batch is full at max_num_seqs")

	// Draining or down replicas get nothing.
	set.Capacity = func(string) (int64, int64, gpu.State) { return 1000, 1000, gpu.StateDraining }
	assert.Nil(t, set.choose(Route{}, 1, nil))
	assert.False(t, set.AnyUp())
}
