package main

import "context"

func runBench(context.Context, env, []string) error { return errNotImplemented }
