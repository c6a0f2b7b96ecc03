package gpu

import (
	"testing"
	"testing/synctest"
)

// synctestRun runs f in a synctest bubble (fake time).
func synctestRun(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, f)
}
