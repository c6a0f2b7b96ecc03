//go:build !unix

package node

// lockDataDir is a no-op where flock is unavailable: there, each process
// must be given its own data_dir.
func lockDataDir(string) (func(), error) { return func() {}, nil }
