package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMarkGoneAndReap: a replica marked gone takes no new work at once,
// stays a member while a request runs there, and Reap removes it only
// once nothing is in flight; its slot is then free again.
func TestMarkGoneAndReap(t *testing.T) {
	t.Parallel()
	a, b := rep("a", 8), rep("b", 8)
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000}), a, b)
	require.Equal(t, a, set.choose(Route{}, 10, nil))
	b.Load.Store(500) // a is the least loaded

	assert.False(t, set.MarkGone(a), "first leave")
	assert.True(t, set.MarkGone(a), "already gone")
	assert.Equal(t, b, set.choose(Route{}, 10, nil), "gone: no new work, however empty")
	assert.False(t, set.Up(a))

	assert.Empty(t, set.Reap(), "a request still runs on a")
	assert.Equal(t, []string{"a", "b"}, set.Names(), "still scraped while it drains")
	assert.Len(t, set.Targets(), 2)
	assert.Equal(t, a, set.Get("a"))
	set.Release(a, 10)
	assert.Equal(t, []string{"a"}, set.Reap())
	assert.Nil(t, set.Get("a"))
	assert.Equal(t, []string{"b"}, set.Names())
	assert.Equal(t, []*Replica{b}, set.List())
	assert.Equal(t, 0, FreeSlot(set.List()), "a's slot is free again")
	assert.Equal(t, 2, FreeSlot([]*Replica{a, b}))
}
