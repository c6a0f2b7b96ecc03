package docs

import (
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// mdLink matches a markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// mdHeading matches a markdown heading outside code fences (checked by
// the caller).
var mdHeading = regexp.MustCompile(`^#{1,6} (.+)$`)

// anchors returns the GitHub anchors of a markdown page's headings.
func anchors(b []byte) map[string]bool {
	out := map[string]bool{}
	fence := false
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		m := mdHeading.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		var a strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '§' && r != '→' && r != '—' && r != '–':
				a.WriteRune(r)
			}
		}
		out[a.String()] = true
	}
	return out
}

// TestLinksResolve: every relative link in the repository's markdown
// names a file of the repository and, for a markdown page, one of its
// headings, so moving a section or a page fails here instead of leaving a
// reader at a dead link.
func TestLinksResolve(t *testing.T) {
	files := repoFiles(t, "..")
	checked := 0
	for name, b := range files {
		if !strings.HasSuffix(name, ".md") {
			continue
		}
		fence := false
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				resolved := name
				if file != "" {
					resolved = path.Clean(path.Join(path.Dir(name), file))
				}
				checked++
				body, ok := files[resolved]
				if !ok && !isDir(files, resolved) {
					assert.Fail(t, "dead link", "%s links to %s: no such file", name, target)
					continue
				}
				if anchor != "" && strings.HasSuffix(resolved, ".md") {
					assert.True(t, anchors(body)[anchor], "%s links to %s: %s has no heading #%s", name, target, resolved, anchor)
				}
			}
		}
	}
	assert.Greater(t, checked, 20, "the scan found the links")
}

// isDir reports whether some file of the repository lies under dir.
func isDir(files map[string][]byte, dir string) bool {
	for name := range files {
		if strings.HasPrefix(name, strings.TrimSuffix(dir, "/")+"/") {
			return true
		}
	}
	return false
}
