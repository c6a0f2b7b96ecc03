//go:build !linux

package main

// tuneRuntime is a no-op off Linux (see sysmon_linux.go).
func tuneRuntime([]string) {}
