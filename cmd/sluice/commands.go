package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

// env carries the process's standard streams to a subcommand.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// command is one subcommand. run returns a usageError for bad flags or
// input (exit 2) and any other error for a failure (exit 1).
type command struct {
	summary string
	run     func(ctx context.Context, e env, args []string) error
}

// usageError marks an error as the user's: bad flags, bad input, bad config.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// usagef builds a usageError; the caller's message is printed as one line.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// errNotImplemented is returned by subcommands whose issue has not landed.
var errNotImplemented = errors.New("not implemented yet")

func commands() map[string]command {
	return map[string]command{
		"version":      {"print the version", runVersion},
		"serve":        {"run the scheduler (--config FILE or SLUICE_CONFIG)", runServe},
		"sim":          {"run the vLLM simulator", runSim},
		"bench":        {"load generator: run|ab|compare|sweep", runBench},
		"demo":         {"simulated replicas + server + a short multi-tenant bench", runDemo},
		"config":       {"config check FILE", runConfig},
		"key":          {"key hash: read an API key on stdin, print sha256:<hex>", runKey},
		"gpus":         {"list the node's GPUs (NVML)", runGPUs},
		"budget":       {"admin: budget set|list|rm", runBudget},
		"reservations": {"admin: reservations list|resolve", runReservations},
		"tenant":       {"admin: tenant clamp|unclamp", runTenant},
		"drain":        {"admin: drain the server", runDrain},
		"reload":       {"admin: reload the server's config", runReload},
		"audit":        {"audit verify FILE...", runAudit},
		"tune":         {"recommend queue depth, max wait (and concurrency) from bench results", runTune},
	}
}

// run dispatches to a subcommand and maps its error to an exit code:
// 0 success, 1 failure, 2 usage (one clear line on stderr).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q (run 'sluice help')\n", args[0])
		return 2
	}
	err := c.run(ctx, env{stdin: stdin, stdout: stdout, stderr: stderr}, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errNotImplemented):
		fmt.Fprintf(stderr, "sluice %s: not implemented yet\n", args[0])
		return 2
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "sluice %s: %s\n", args[0], oneLine(err.Error()))
		return 2
	}
	fmt.Fprintf(stderr, "sluice %s: %v\n", args[0], err)
	return 1
}

func oneLine(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ") }

func printUsage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: sluice <command> [flags]")
	for _, n := range names {
		fmt.Fprintf(w, "  %-13s %s\n", n, cmds[n].summary)
	}
}

// newFlags returns a FlagSet that reports errors instead of exiting and
// prints nothing itself; parse wraps its errors as usage errors.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args and refuses stray positional arguments beyond maxPos
// (maxPos < 0: any number).
func parseFlags(fs *flag.FlagSet, args []string, maxPos int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if maxPos >= 0 && fs.NArg() > maxPos {
		return usagef("unexpected argument %q", fs.Arg(maxPos))
	}
	return nil
}

func runVersion(_ context.Context, e env, args []string) error {
	if err := parseFlags(newFlags("version"), args, 0); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "sluice %s\n", version)
	return nil
}
