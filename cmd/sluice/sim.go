package main

import "context"

func runSim(context.Context, env, []string) error { return errNotImplemented }
