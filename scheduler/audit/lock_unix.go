//go:build unix

package audit

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile takes an exclusive, non-blocking flock on <path>.lock so that a
// second Log (in this or another process) cannot interleave lines into the
// same chain. The lock lives as long as the returned file.
func lockFile(path string) (*os.File, error) {
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		cerr := f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.Join(fmt.Errorf("audit: %s: %w", path, ErrLocked), cerr)
		}
		return nil, errors.Join(fmt.Errorf("audit: lock %s: %w", name, err), cerr)
	}
	return f, nil
}
