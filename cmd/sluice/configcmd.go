package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/scheduler/config"
)

// runConfigCheck implements `sluice config check FILE`: exit 0 when the
// file is valid, 2 with every problem listed otherwise.
func runConfigCheck(_ context.Context, e env, args []string) error {
	fs := newFlags("config check")
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("usage: sluice config check FILE")
	}
	f, err := config.Load(fs.Arg(0))
	if err != nil {
		return usageError{err}
	}
	fmt.Fprintf(e.stdout, "%s: ok (%d tenants, %d replicas, ledger %s)\n",
		fs.Arg(0), len(f.Tenants), len(f.Upstream.Replicas), f.Ledger.Backend)
	return nil
}

// runKeyHash implements `sluice key hash`: reads one key on stdin and
// prints the form the config stores, so raw keys never sit in a config file.
func runKeyHash(_ context.Context, e env, args []string) error {
	if err := parseFlags(newFlags("key hash"), args, 0); err != nil {
		return err
	}
	line, err := bufio.NewReader(io.LimitReader(e.stdin, 64<<10)).ReadString('\n')
	if err != nil && err != io.EOF {
		return fmt.Errorf("read key: %w", err)
	}
	key := strings.TrimRight(line, "\r\n")
	if strings.TrimSpace(key) == "" {
		return usagef("no key on stdin")
	}
	fmt.Fprintln(e.stdout, config.HashKey(key))
	return nil
}
