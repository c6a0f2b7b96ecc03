// Command sluice is the Sluice scheduler, its vLLM simulator, its load
// generator and the admin clients, in one binary.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	tuneRuntime(os.Args[1:]) // sysmon_linux.go: may re-execute serve
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
