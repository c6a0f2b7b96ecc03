//go:build !unix

package statestore

// lock is a no-op where flock is unavailable: there, only one process may
// write a directory (File's mutex still orders its goroutines).
func lock(string) (func(), error) { return func() {}, nil }
