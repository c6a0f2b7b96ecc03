package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLoRAResidentPreferred: a request for a LoRA adapter goes to the
// replica whose running requests already use it unless another is more
// than loraBias emptier; base-model requests are unaffected.
func TestLoRAResidentPreferred(t *testing.T) {
	t.Parallel()
	a := rep("a", 64)
	b := rep("b", 64)
	set := newSet(fixedCapacity(map[string]int64{"a": 1000, "b": 1000}), a, b)
	models := []string{"base", "ad"}
	parents := map[string]string{"ad": "base"}
	a.Obs.Store(&Obs{OK: true, Models: models, Parents: parents})
	b.Obs.Store(&Obs{OK: true, Models: models, Parents: parents, LoRAs: []string{"ad"}})
	a.Load.Store(100)
	b.Load.Store(150) // 5% of capacity more than a

	assert.Equal(t, b, set.pick0(Route{Model: "ad"}, 10), "adapter resident on b")
	assert.Equal(t, a, set.pick0(Route{Model: "base"}, 10), "base model: least load")
	b.Load.Store(250) // 15% more: the load wins
	assert.Equal(t, a, set.pick0(Route{Model: "ad"}, 10))
	// An adapter resident nowhere: least load decides.
	b.Obs.Store(&Obs{OK: true, Models: models, Parents: parents})
	b.Load.Store(150)
	assert.Equal(t, a, set.pick0(Route{Model: "ad"}, 10))
}
