//go:build !unix

package audit

import "os"

// lockFile is a no-op where flock is unavailable: keep one Log per path.
func lockFile(string) (*os.File, error) { return nil, nil }
