package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// tuneChange is one value --config would change that the operator had
// set in the file.
type tuneChange struct {
	tenant, field, from, to string
}

func (c tuneChange) String() string {
	return fmt.Sprintf("tenant %s: %s %s -> %s", c.tenant, c.field, c.from, c.to)
}

// textEdit replaces n bytes at off with text.
type textEdit struct {
	off, n, seq int
	text        string
}

// applyTune sets the recommended values on the config's tenants of the
// same name (others are left alone). It finds each value in the YAML node
// tree and edits the file's text in place: a value already set is
// replaced where it stands (keeping its quotes), a missing one is added
// next to the tenant's name in the style of its surroundings; every other
// byte (comments, blank lines, key order, indentation, flow style) stays
// as it was. It also returns each value the file had set that the
// recommendations replace.
func applyTune(raw []byte, recs []tuneRec) ([]byte, []tuneChange, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("not a config mapping")
	}
	tenants := mapValue(doc.Content[0], "tenants")
	if tenants == nil || tenants.Kind != yaml.SequenceNode {
		return nil, nil, fmt.Errorf("no tenants list in the config")
	}
	src := string(raw)
	lines := lineOffsets(src)
	byName := map[string]*yaml.Node{}
	for _, t := range tenants.Content {
		if t.Kind != yaml.MappingNode {
			continue
		}
		if n := mapValue(t, "name"); n != nil && n.Kind == yaml.ScalarNode {
			byName[n.Value] = t
		}
	}
	var edits []textEdit
	var changes []tuneChange
	for _, r := range recs {
		t := byName[r.name]
		if t == nil {
			return nil, nil, fmt.Errorf("no tenant %q in the config", r.name)
		}
		e := editor{src: src, lines: lines, tenant: r.name}
		want := [][2]string{{"max_wait", r.maxWait.String()}, {"max_depth", strconv.Itoa(r.maxDepth)}}
		if q := mapValue(t, "queue"); q == nil {
			e.add(t, "queue", "{max_wait: "+want[0][1]+", max_depth: "+want[1][1]+"}")
		} else {
			if q.Kind != yaml.MappingNode {
				return nil, nil, fmt.Errorf("tenant %q: queue is not a mapping", r.name)
			}
			e.set(q, "queue.", want[0][0], want[0][1], sameDuration, true)
			e.set(q, "queue.", want[1][0], want[1][1], sameInt, false)
		}
		if r.concurrency > 0 {
			e.set(t, "", "concurrency", strconv.Itoa(r.concurrency), sameInt, false)
		}
		if e.err != nil {
			return nil, nil, e.err
		}
		edits, changes = append(edits, e.edits...), append(changes, e.changes...)
	}
	// Apply from the end, so earlier offsets stay valid; of edits at one
	// offset the later-made goes in first, so they read in the order made.
	for i := range edits {
		edits[i].seq = i
	}
	slices.SortFunc(edits, func(a, b textEdit) int {
		if a.off != b.off {
			return b.off - a.off
		}
		return b.seq - a.seq
	})
	out := src
	for _, ed := range edits {
		out = out[:ed.off] + ed.text + out[ed.off+ed.n:]
	}
	return []byte(out), changes, nil
}

// editor collects the text edits of one tenant.
type editor struct {
	src     string
	lines   []int // byte offset of each line's start
	tenant  string
	edits   []textEdit
	changes []tuneChange
	err     error
}

// set makes m[key] value: replaces the scalar in place (a string keeps
// its quotes), or adds the key.
func (e *editor) set(m *yaml.Node, prefix, key, value string, same func(a, b string) bool, isString bool) {
	v := mapValue(m, key)
	if v == nil {
		e.add(m, key, value)
		return
	}
	if v.Kind != yaml.ScalarNode {
		e.err = fmt.Errorf("tenant %q: %s%s is not a scalar", e.tenant, prefix, key)
		return
	}
	if v.Tag != "!!null" && same(v.Value, value) {
		return
	}
	if v.Tag != "!!null" {
		e.changes = append(e.changes, tuneChange{tenant: e.tenant, field: prefix + key, from: v.Value, to: value})
	}
	off, n, ok := e.token(v)
	if !ok {
		e.err = fmt.Errorf("tenant %q: cannot locate %s%s in the file", e.tenant, prefix, key)
		return
	}
	if q := e.src[off]; isString && (q == '"' || q == '\'') {
		value = string(q) + value + string(q)
	}
	e.edits = append(e.edits, textEdit{off: off, n: n, text: value})
}

// add inserts "key: value" into mapping m: in a flow mapping as
// ", key: value" after its last entry, in a block mapping as a line of its
// own after the first entry, at its indentation.
func (e *editor) add(m *yaml.Node, key, value string) {
	if len(m.Content) < 2 {
		e.err = fmt.Errorf("tenant %q: cannot place %s in an empty mapping", e.tenant, key)
		return
	}
	first := m.Content[0]
	if m.Style&yaml.FlowStyle != 0 {
		// After the last entry whose value is a scalar (its end is known).
		var last *yaml.Node
		for i := len(m.Content) - 1; i > 0 && last == nil; i -= 2 {
			if m.Content[i].Kind == yaml.ScalarNode {
				last = m.Content[i]
			}
		}
		if last == nil {
			e.err = fmt.Errorf("tenant %q: cannot place %s (no scalar value in the mapping)", e.tenant, key)
			return
		}
		off, n, ok := e.token(last)
		if !ok {
			e.err = fmt.Errorf("tenant %q: cannot place %s", e.tenant, key)
			return
		}
		e.edits = append(e.edits, textEdit{off: off + n, text: ", " + key + ": " + value})
		return
	}
	// After the first entry's line (its value is one scalar on that line).
	if m.Content[1].Kind != yaml.ScalarNode {
		e.err = fmt.Errorf("tenant %q: cannot place %s (the mapping's first value is not a scalar)", e.tenant, key)
		return
	}
	end := len(e.src)
	if first.Line < len(e.lines) {
		end = e.lines[first.Line]
	}
	line := strings.Repeat(" ", first.Column-1) + key + ": " + value + "\n"
	if end == len(e.src) && !strings.HasSuffix(e.src, "\n") {
		line = "\n" + strings.TrimSuffix(line, "\n")
	}
	e.edits = append(e.edits, textEdit{off: end, text: line})
}

// token finds a scalar's bytes in the source: its start from the node's
// line and column, its end by its style.
func (e *editor) token(v *yaml.Node) (off, n int, ok bool) {
	if v.Line < 1 || v.Line > len(e.lines) {
		return 0, 0, false
	}
	lineEnd := len(e.src)
	if v.Line < len(e.lines) {
		lineEnd = e.lines[v.Line]
	}
	line := e.src[e.lines[v.Line-1]:lineEnd]
	runes := []rune(line)
	if v.Column-1 > len(runes) {
		return 0, 0, false
	}
	off = e.lines[v.Line-1] + len(string(runes[:v.Column-1]))
	rest := e.src[off:lineEnd]
	switch {
	case v.Style&yaml.DoubleQuotedStyle != 0:
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++
				continue
			}
			if rest[i] == '"' {
				return off, i + 1, true
			}
		}
	case v.Style&yaml.SingleQuotedStyle != 0:
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\'' {
				if i+1 < len(rest) && rest[i+1] == '\'' {
					i++
					continue
				}
				return off, i + 1, true
			}
		}
	case v.Style == 0 && strings.HasPrefix(rest, v.Value):
		return off, len(v.Value), true
	}
	return 0, 0, false
}

func lineOffsets(s string) []int {
	offs := []int{0}
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' && i+1 < len(s) {
			offs = append(offs, i+1)
		}
	}
	return offs
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func sameDuration(a, b string) bool {
	x, err1 := time.ParseDuration(a)
	y, err2 := time.ParseDuration(b)
	return err1 == nil && err2 == nil && x == y
}

func sameInt(a, b string) bool {
	x, err1 := strconv.ParseInt(strings.ReplaceAll(a, "_", ""), 0, 64)
	y, err2 := strconv.ParseInt(b, 0, 64)
	return err1 == nil && err2 == nil && x == y
}
