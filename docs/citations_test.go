// Package docs holds Sluice's design pages. Its test checks that the
// repository's citations of them resolve and that nothing points outside the
// repository.
package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// citation matches "LEDGER.md §8", "SCHEDULING §7–§9", "BENCH.md §5–6",
// "VLLM.md §1.7" and "VLLM.md Part 3".
var citation = regexp.MustCompile(`\b(ARCHITECTURE|LEDGER|SCHEDULING|VLLM|BENCH|HOUSE-STYLE)(?:\.md)?,? *(?:§ *(\d+(?:\.\d+)?)(?: *[–-] *§? *(\d+(?:\.\d+)?))?|[Pp]art (\d+))`)

// heading matches "## 3. …", "### 3.3 …" and "## Part 1. …".
var heading = regexp.MustCompile(`(?m)^#{2,3} (?:Part )?(\d+(?:\.\d+)?)\.? `)

// outside are the references to paths outside the repository that must not
// come back (split so this file does not match itself).
var outside = []string{"../" + "shared", "shared" + "/design", "/" + "work/"}

// repoFiles returns the repository's text files (relative to the root),
// skipping what .gitignore keeps out and anything binary.
func repoFiles(t *testing.T, root string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.Name() == ".git" && d.IsDir() {
			return filepath.SkipDir
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", "bin", ".gl", ".whl":
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || d.Name() == ".git" || rel == "sluice" || strings.HasSuffix(rel, ".test") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	require.NoError(t, err)
	return files
}

// TestCitationsResolve: every "X.md §N" (or "X §N", "X.md Part N") in the
// repository names a section that docs/X.md has, so a renumbered or removed
// section fails here instead of leaving the code pointing nowhere.
func TestCitationsResolve(t *testing.T) {
	files := repoFiles(t, "..")
	sections := map[string]map[string]bool{}
	for _, page := range []string{"ARCHITECTURE", "LEDGER", "SCHEDULING", "VLLM", "BENCH", "HOUSE-STYLE"} {
		b, ok := files["docs/"+page+".md"]
		require.True(t, ok, "docs/%s.md is missing", page)
		sections[page] = map[string]bool{}
		for _, m := range heading.FindAllSubmatch(b, -1) {
			sections[page][string(m[1])] = true
		}
	}
	checked := 0
	for name, b := range files {
		if !bytes.Contains(b, []byte("§")) && !bytes.Contains(b, []byte("art ")) {
			continue
		}
		for _, m := range citation.FindAllSubmatch(b, -1) {
			page := string(m[1])
			for _, sec := range m[2:] {
				if len(sec) == 0 {
					continue
				}
				checked++
				assert.True(t, sections[page][string(sec)], "%s cites %q, but docs/%s.md has no section %s", name, m[0], page, sec)
			}
		}
	}
	assert.Greater(t, checked, 50, "the scan found the code's citations")
}

// TestNoPathsOutsideTheRepository: the design lives in docs/; nothing may
// point at the directories it came from.
func TestNoPathsOutsideTheRepository(t *testing.T) {
	for name, b := range repoFiles(t, "..") {
		for _, o := range outside {
			assert.NotContains(t, string(b), o, "%s refers to a path outside the repository", name)
		}
	}
}

// testName matches a Go test or benchmark named in backticks, optionally
// with a subtest path: `TestT9StoreDown`, `T19_LeakRegressions/*`.
var testName = regexp.MustCompile("`((?:Test|Benchmark)[A-Z0-9]\\w*|T\\d+_\\w+)(?:/[^`]*)?`")

// TestDocsNameRealTests: every test the design pages name (the T1–T19
// matrix, the benchmarks) exists, so a renamed or deleted test fails here
// instead of leaving the matrix pointing at nothing.
func TestDocsNameRealTests(t *testing.T) {
	files := repoFiles(t, "..")
	var code strings.Builder
	for name, b := range files {
		if strings.HasSuffix(name, ".go") {
			code.Write(b)
		}
	}
	src := code.String()
	named := 0
	for name, b := range files {
		// HOUSE-STYLE.md names tests of other code bases as examples.
		if !strings.HasPrefix(name, "docs/") || !strings.HasSuffix(name, ".md") || name == "docs/HOUSE-STYLE.md" {
			continue
		}
		for _, m := range testName.FindAllStringSubmatch(string(b), -1) {
			named++
			n := m[1]
			if strings.HasPrefix(n, "Test") || strings.HasPrefix(n, "Benchmark") {
				assert.True(t, strings.Contains(src, "func "+n+"("), "%s names %s, which no _test.go defines", name, n) //nolint:testifylint // Contains would dump every .go file on failure
			} else {
				assert.True(t, strings.Contains(src, `"`+n+`"`), "%s names the subtest %s, which no test runs", name, n) //nolint:testifylint // Contains would dump every .go file on failure
			}
		}
	}
	assert.Greater(t, named, 30, "the scan found the named tests")
}
