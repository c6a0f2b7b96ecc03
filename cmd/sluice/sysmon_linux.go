package main

import (
	"os"
	"strings"
	"syscall"
)

// sysmonGODEBUG keeps the Go runtime's sysmon thread out of its deep sleep.
// sysmon sleeps on a note whenever every P is idle, and the next system
// call wakes it and resets its tick to 20 µs (runtime/proc.go, sysmon and
// entersyscallWakeSysmon). An edge goes idle between bursts of replies
// hundreds of times a second, so sysmon wakes and nanosleeps about once
// per request: on the edgecpu.sh set-up, 1.0 nanosleep and 2.9 context
// switches per request, ~15 % of Sluice's CPU. With schedtrace set, sysmon
// never takes the deep sleep and backs off to its 10 ms tick as in any busy
// Go process: 0.13 nanosleeps and 1.7 context switches per request. The
// trace itself is a line on stderr once per 24.8 days of uptime (the
// largest period). docs/benchmarks/cpu-per-request.md has the figures.
const sysmonGODEBUG = "schedtrace=2147483647"

// tuneRuntime re-executes `sluice serve` (execve: same PID, nothing else
// has run yet) with sysmonGODEBUG added to GODEBUG, which the runtime reads
// only at start, when the operator opted in with SLUICE_GO_SYSMON=awake;
// see tunedEnv. It is opt-in because a re-exec and a runtime trace setting
// are side effects a supervisor, a debugger or a GODEBUG user should ask
// for. It returns only when it did not re-execute.
func tuneRuntime(args []string) {
	env, ok := tunedEnv(args, os.Environ())
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, env) // on failure, serve as is
}

// tunedEnv is environ with sysmonGODEBUG added to GODEBUG, and false when
// there is nothing to do: SLUICE_GO_SYSMON is not "awake", a command other
// than serve, or GODEBUG setting schedtrace already (also after the
// re-exec).
func tunedEnv(args, environ []string) ([]string, bool) {
	if len(args) == 0 || args[0] != "serve" {
		return nil, false
	}
	gd, awake := "", false
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		switch {
		case kv == "SLUICE_GO_SYSMON=awake":
			awake = true
			env = append(env, kv)
		case strings.HasPrefix(kv, "GODEBUG="):
			gd = strings.TrimPrefix(kv, "GODEBUG=")
		default:
			env = append(env, kv)
		}
	}
	if !awake || strings.Contains(gd, "schedtrace=") {
		return nil, false
	}
	if gd != "" {
		gd += ","
	}
	return append(env, "GODEBUG="+gd+sysmonGODEBUG), true
}
