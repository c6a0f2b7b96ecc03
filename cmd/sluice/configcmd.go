package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
	path := fs.Arg(0)
	f, err := config.Load(path)
	if err != nil {
		if pe := (*os.PathError)(nil); errors.As(err, &pe) {
			return usageError{err}
		}
		// One problem a line, as a compiler lists them: FILE:LINE: message.
		ps := config.Problems(err)
		for _, p := range ps {
			fmt.Fprintln(e.stderr, problemLine(path, p, ""))
		}
		return usagef("%d problem(s) in %s", len(ps), path)
	}
	for _, w := range f.Warnings() {
		fmt.Fprintln(e.stderr, problemLine(path, w, "warning: "))
	}
	fmt.Fprintf(e.stdout, "%s: ok (%d tenants, %d replicas, ledger %s)\n",
		path, len(f.Tenants), len(f.Upstream.Replicas), f.Ledger.Backend)
	return nil
}

// problemLine is FILE:LINE: message, or FILE: message for a problem with
// no line (a field left to its default).
func problemLine(file string, p config.Problem, kind string) string {
	if p.Line > 0 {
		return fmt.Sprintf("%s:%d: %s%s", file, p.Line, kind, p.Msg)
	}
	return fmt.Sprintf("%s: %s%s", file, kind, p.Msg)
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
