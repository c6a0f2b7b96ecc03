package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTunedEnv(t *testing.T) {
	env, ok := tunedEnv([]string{"serve", "--config", "x"}, []string{"HOME=/root", "GODEBUG=madvdontneed=1", "SLUICE_GO_SYSMON=awake"})
	assert.True(t, ok)
	assert.Equal(t, []string{"HOME=/root", "SLUICE_GO_SYSMON=awake", "GODEBUG=madvdontneed=1," + sysmonGODEBUG}, env)

	env, ok = tunedEnv([]string{"serve"}, []string{"SLUICE_GO_SYSMON=awake", "HOME=/root"})
	assert.True(t, ok)
	assert.Equal(t, []string{"SLUICE_GO_SYSMON=awake", "HOME=/root", "GODEBUG=" + sysmonGODEBUG}, env)

	for name, tc := range map[string]struct{ args, environ []string }{
		"no command":        {nil, nil},
		"the default":       {[]string{"serve"}, []string{"HOME=/root"}},
		"another command":   {[]string{"sim"}, []string{"SLUICE_GO_SYSMON=awake"}},
		"after the re-exec": {[]string{"serve"}, []string{"SLUICE_GO_SYSMON=awake", "GODEBUG=" + sysmonGODEBUG}},
		"operator's trace":  {[]string{"serve"}, []string{"SLUICE_GO_SYSMON=awake", "GODEBUG=schedtrace=1000"}},
		"another value":     {[]string{"serve"}, []string{"SLUICE_GO_SYSMON=default"}},
	} {
		_, ok := tunedEnv(tc.args, tc.environ)
		assert.False(t, ok, name)
	}
}
