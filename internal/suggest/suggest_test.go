package suggest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestClosest(t *testing.T) {
	t.Parallel()
	cmds := []string{"serve", "sim", "bench", "budget", "version", "reload", "tune", "config"}
	for _, tc := range []struct{ word, want string }{
		{"serv", "serve"},
		{"verison", "version"},
		{"bnech", "bench"},
		{"relaod", "reload"},
		{"budgte", "budget"},
		{"frobnicate", ""},
		{"x", ""},
		{"conf", "config"},
	} {
		assert.Equal(t, tc.want, Closest(tc.word, cmds), tc.word)
	}
	assert.Equal(t, "base-url", Closest("base-ur", []string{"base-url", "backend", "burstiness"}))
	assert.Equal(t, "max_wait", Closest("max_wiat", []string{"max_depth", "max_bytes", "max_wait", "order"}))
	assert.Equal(t, 2, distance("kitten", "sitting")-1)
}
