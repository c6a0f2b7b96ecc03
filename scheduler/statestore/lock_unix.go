//go:build unix

package statestore

import (
	"errors"
	"os"
	"syscall"
)

// lock takes a blocking exclusive flock on path; the returned func releases
// it. flock conflicts between open file descriptions, so it also orders two
// File values of one process.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
