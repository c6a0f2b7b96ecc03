package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTunedEnv(t *testing.T) {
	env, ok := tunedEnv([]string{"serve", "--config", "x"}, []string{"HOME=/root", "GODEBUG=madvdontneed=1"})
	assert.True(t, ok)
	assert.Equal(t, []string{"HOME=/root", "GODEBUG=madvdontneed=1," + sysmonGODEBUG}, env)

	env, ok = tunedEnv([]string{"serve"}, []string{"HOME=/root"})
	assert.True(t, ok)
	assert.Equal(t, []string{"HOME=/root", "GODEBUG=" + sysmonGODEBUG}, env)

	for name, tc := range map[string]struct{ args, environ []string }{
		"another command":   {[]string{"sim"}, nil},
		"no command":        {nil, nil},
		"after the re-exec": {[]string{"serve"}, []string{"GODEBUG=" + sysmonGODEBUG}},
		"operator's trace":  {[]string{"serve"}, []string{"GODEBUG=schedtrace=1000"}},
		"opted out":         {[]string{"serve"}, []string{"SLUICE_GO_SYSMON=default"}},
	} {
		_, ok := tunedEnv(tc.args, tc.environ)
		assert.False(t, ok, name)
	}
}
