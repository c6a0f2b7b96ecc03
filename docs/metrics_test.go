package docs

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metricName matches a "sluice_…" string literal in Go source. Prefixes
// ending in "_" (Redis function names) do not match; sluice_status is the
// status page's cookie.
var metricName = regexp.MustCompile(`"(sluice_[a-z0-9_]*[a-z0-9])"`)

// TestMetricsDocumented: every sluice_ metric the code registers is named
// in the metrics table of docs/operations.md, and the table names no
// metric the code does not have.
func TestMetricsDocumented(t *testing.T) {
	files := repoFiles(t, "..")
	page, ok := files["docs/operations.md"]
	require.True(t, ok)
	_, table, ok := strings.Cut(string(page), "\n## Metrics\n")
	require.True(t, ok, "docs/operations.md has no Metrics section")
	table, _, _ = strings.Cut(table, "\n## ")
	code := map[string]string{}
	for name, b := range files {
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, "cmd/") {
			continue // cmd/ only reads metrics (tune, demo)
		}
		for _, m := range metricName.FindAllSubmatch(b, -1) {
			if n := string(m[1]); n != "sluice_status" {
				code[n] = name
			}
		}
	}
	require.Greater(t, len(code), 40, "the scan found the metrics")
	for n, file := range code {
		assert.True(t, strings.Contains(table, "| `"+n+"` |"), "%s registers %s; docs/operations.md's metrics table does not name it", file, n) //nolint:testifylint // Contains would dump the table on failure
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `(sluice_[a-z0-9_]+)` \\|").FindAllStringSubmatch(table, -1) {
		_, ok := code[m[1]]
		assert.True(t, ok, "docs/operations.md names %s, which no code registers", m[1])
	}
}
