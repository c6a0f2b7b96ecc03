package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// The admin clients of the server as a whole: drain and reload.

// runDrain implements `sluice drain`: the server stops admitting, finishes
// what it runs and exits.
func runDrain(ctx context.Context, e env, args []string) error {
	fs := newFlags("drain")
	o := addAdminFlags(fs)
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	return c.call(ctx, e, o, http.MethodPost, "/admin/drain", nil, nil, func(w io.Writer, data []byte) error {
		var r struct {
			Status string `json:"status"`
		}
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		_, err := fmt.Fprintln(w, r.Status)
		return err
	})
}

// runReload implements `sluice reload`: the server re-reads its config file.
func runReload(ctx context.Context, e env, args []string) error {
	fs := newFlags("reload")
	o := addAdminFlags(fs)
	if _, err := parseInterleaved(fs, args, 0); err != nil {
		return err
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	return c.call(ctx, e, o, http.MethodPost, "/admin/reload", nil, nil, func(w io.Writer, data []byte) error {
		var r struct {
			Status        string   `json:"status"`
			Version       *int64   `json:"version"`
			RestartNeeded []string `json:"restart_needed"`
		}
		if err := decodeInto(data, &r); err != nil {
			return err
		}
		if r.Version != nil {
			fmt.Fprintf(w, "%s (config version %d)\n", r.Status, *r.Version)
		} else {
			fmt.Fprintln(w, r.Status)
		}
		if len(r.RestartNeeded) > 0 {
			fmt.Fprintln(w, "not applied: these fields take effect only at a restart (the server still runs with its start-up values):")
			for _, f := range r.RestartNeeded {
				fmt.Fprintf(w, "  %s\n", f)
			}
		}
		return nil
	})
}
