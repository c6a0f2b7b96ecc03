// Package atomicfile replaces a file's content so that a crash leaves the
// old content or the new one, never a torn mix: the durable files Sluice
// rewrites whole (the admin state, the pending-writes log, the file-backed
// shared documents) all go through [Replace].
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Replace writes b to a temporary file beside path and renames it over
// path. With sync, the temporary file is fsynced before the rename and the
// directory after it, so the new content also survives a machine crash;
// without, a killed process still never leaves a torn file.
func Replace(path string, b []byte, sync bool) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	_, werr := tmp.Write(b)
	var serr error
	if sync && werr == nil {
		serr = tmp.Sync()
	}
	if err = errors.Join(werr, serr, tmp.Close()); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
