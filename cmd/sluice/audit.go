package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/scheduler/audit"
)

const auditUsage = "usage: sluice audit verify [-partial] FILE..."

// runAudit implements `sluice audit verify FILE...`: exit 0 with a one-line
// summary when the files form one unbroken hash chain, 1 with the first
// broken, missing or reordered line (file:line) otherwise. A single FILE is
// the current log; its rotated siblings (FILE.1, FILE.2, …) are found and
// checked first.
func runAudit(_ context.Context, e env, args []string) error {
	fs := newFlags("audit verify")
	partial := fs.Bool("partial", false, "accept a chain whose oldest files were deleted (first line need not be seq 1)")
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usagef(auditUsage)
	}
	rep, err := audit.VerifyOptions{Partial: *partial}.Verify(fs.Args()...)
	var le *audit.LineError
	switch {
	case errors.As(err, &le):
		return fmt.Errorf("verify: %w (%d good lines before it)", err, rep.Lines)
	case err != nil:
		return fmt.Errorf("verify: %w", err)
	}
	if rep.Lines == 0 {
		fmt.Fprintf(e.stdout, "ok: 0 lines in %d file(s)\n", len(rep.Files))
		return nil
	}
	fmt.Fprintf(e.stdout, "ok: %d lines, seq %d..%d, %d file(s), head %s\n",
		rep.Lines, rep.FirstSeq, rep.LastSeq, len(rep.Files), rep.LastHash)
	return nil
}
