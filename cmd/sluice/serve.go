package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/node"
)

// runServe implements `sluice serve --config FILE`.
func runServe(ctx context.Context, e env, args []string) error {
	fs := newFlags("serve")
	path := fs.String("config", os.Getenv("SLUICE_CONFIG"), "config file (default $SLUICE_CONFIG)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *path == "" {
		return usagef("--config FILE (or SLUICE_CONFIG) is required")
	}
	cfg, err := config.Load(*path)
	if err != nil {
		if pe := (*os.PathError)(nil); errors.As(err, &pe) {
			return usageError{err}
		}
		ps := config.Problems(err) // one a line, as config check prints them
		for _, p := range ps {
			fmt.Fprintln(e.stderr, problemLine(*path, p, ""))
		}
		return usagef("%d problem(s) in %s", len(ps), *path)
	}
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	for _, w := range cfg.Warnings() {
		log.Warn("config: "+w.Msg, "file", *path, "line", w.Line)
	}
	return node.Run(ctx, cfg, node.Options{ConfigPath: *path, Log: log, AdminToken: os.Getenv("SLUICE_ADMIN_TOKEN")})
}
