// Package archdoc checks that the package map in docs/ARCHITECTURE.md (§6)
// says what the code does: every package of the module with non-test Go
// files is listed, with exactly the module packages its non-test files
// import. A new import, a new package or a removed one fails here until the
// map says so, so the map a reader trusts cannot drift from `go list`.
package archdoc

import (
	"bufio"
	"errors"
	"fmt"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	module  = "github.com/sluicehq/sluice"
	root    = "../.."
	doc     = "docs/ARCHITECTURE.md"
	heading = "## 6. Package map"
)

// codeImports returns, for every directory of the module holding non-test
// Go files (as go/build sees them for this platform), the module packages
// those files import, relative to the module root.
func codeImports(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		switch name := d.Name(); {
		case path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")),
			name == "testdata", name == "node_modules", name == "bin":
			return filepath.SkipDir
		}
		pkg, err := build.Default.ImportDir(path, 0)
		if err != nil {
			if _, ok := errors.AsType[*build.NoGoError](err); ok {
				return nil
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(pkg.GoFiles)+len(pkg.CgoFiles) == 0 {
			return nil // tests only
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		deps := []string{}
		for _, imp := range pkg.Imports {
			if p, ok := strings.CutPrefix(imp, module+"/"); ok {
				deps = append(deps, p)
			}
		}
		slices.Sort(deps)
		out[rel] = deps
		return nil
	})
	require.NoError(t, err)
	return out
}

var tick = regexp.MustCompile("`([^`]+)`")

// docMap parses the table under heading: "| `pkg` | `dep`, `dep` | what |",
// with "—" for no imports.
func docMap(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, doc))
	require.NoError(t, err)
	defer f.Close()
	out := map[string][]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, heading)
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		require.GreaterOrEqual(t, len(cells), 4, "row %q", line)
		m := tick.FindStringSubmatch(cells[1])
		require.NotNil(t, m, "row %q names no package", line)
		deps := []string{}
		for _, d := range tick.FindAllStringSubmatch(cells[2], -1) {
			deps = append(deps, d[1])
		}
		slices.Sort(deps)
		_, dup := out[m[1]]
		require.False(t, dup, "%s lists %s twice", doc, m[1])
		out[m[1]] = deps
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, out, "%s has no %q table", doc, heading)
	return out
}

// TestPackageMapMatchesImports compares the two and, on a difference,
// prints the rows the map should have.
func TestPackageMapMatchesImports(t *testing.T) {
	code, mapped := codeImports(t), docMap(t)
	require.Contains(t, code, "scheduler", "the walk found the module's packages")
	ok := true
	for pkg, deps := range code {
		got, listed := mapped[pkg]
		if !assert.True(t, listed, "package %s is missing from the map in %s", pkg, doc) {
			ok = false
			continue
		}
		if !assert.Equal(t, deps, got, "imports of %s in %s", pkg, doc) {
			ok = false
		}
	}
	for pkg := range mapped {
		if _, exists := code[pkg]; !assert.True(t, exists, "%s maps %s, which has no non-test Go files", doc, pkg) {
			ok = false
		}
	}
	if !ok {
		pkgs := make([]string, 0, len(code))
		for p := range code {
			pkgs = append(pkgs, p)
		}
		slices.Sort(pkgs)
		var b strings.Builder
		for _, p := range pkgs {
			fmt.Fprintf(&b, "| `%s` | %s |\n", p, joinTicks(code[p]))
		}
		t.Logf("the imports as the code has them (package | imports):\n%s", b.String())
	}
}

func joinTicks(deps []string) string {
	if len(deps) == 0 {
		return "—"
	}
	q := make([]string, len(deps))
	for i, d := range deps {
		q[i] = "`" + d + "`"
	}
	return strings.Join(q, ", ")
}

// TestCentreShape holds the centre to the shape the map describes: the
// composition root (package scheduler itself) stays small, no non-test Go
// file grows past what one reading takes in, and under scheduler/ only the
// client edge speaks fasthttp.
func TestCentreShape(t *testing.T) {
	const rootMax, fileMax = 3000, 800
	rootLines := 0
	for rel := range codeImports(t) {
		pkg, err := build.Default.ImportDir(filepath.Join(root, rel), 0)
		require.NoError(t, err)
		for _, f := range pkg.GoFiles {
			b, err := os.ReadFile(filepath.Join(root, rel, f))
			require.NoError(t, err)
			n := strings.Count(string(b), "\n")
			assert.LessOrEqual(t, n, fileMax, "%s/%s: %d lines", rel, f, n)
			if rel == "scheduler" {
				rootLines += n
			}
		}
		if strings.HasPrefix(rel, "scheduler/") && rel != "scheduler/edge" {
			assert.NotContains(t, pkg.Imports, "github.com/valyala/fasthttp", "%s imports fasthttp; only the client edge may", rel)
		}
	}
	assert.LessOrEqual(t, rootLines, rootMax, "package scheduler is %d non-test lines", rootLines)
	assert.Positive(t, rootLines, "package scheduler was read")
}
