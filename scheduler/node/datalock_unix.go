//go:build unix

package node

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDataDir takes a non-blocking exclusive flock on path for the life of
// the process: a second process on the same data directory would write the
// same outage and outbox files, each overwriting the other's.
func lockDataDir(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		_ = f.Close()
		return nil, fmt.Errorf("another process holds %s: give each process its own data_dir", path)
	}
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
