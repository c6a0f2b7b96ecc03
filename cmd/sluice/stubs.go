package main

import "context"

// Subcommands whose issues have not landed yet. Each moves to its own file
// when it is built.

func runBudget(context.Context, env, []string) error       { return errNotImplemented }
func runReservations(context.Context, env, []string) error { return errNotImplemented }
func runTenant(context.Context, env, []string) error       { return errNotImplemented }
func runDrain(context.Context, env, []string) error        { return errNotImplemented }
func runReload(context.Context, env, []string) error       { return errNotImplemented }
