package config

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/suggest"
)

// Problem is one thing wrong with (or, from Warnings, suspicious in) a
// config file: its field path, the line of the file that sets it (0 when
// the field is absent and took its default) and what is wrong.
type Problem struct {
	Path string
	Line int
	Msg  string // the whole message; it starts with Path
}

func (p Problem) Error() string {
	if p.Line > 0 {
		return fmt.Sprintf("%s (line %d)", p.Msg, p.Line)
	}
	return p.Msg
}

// Problems lists the problems in an error from Parse or Load, in file
// order; an error that is not a config problem comes back as one Problem
// without a line.
func Problems(err error) []Problem {
	if err == nil {
		return nil
	}
	var out []Problem
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c)
			}
			return
		}
		var p Problem
		if errors.As(e, &p) {
			out = append(out, p)
			return
		}
		out = append(out, Problem{Msg: e.Error()})
	}
	walk(err)
	// File order; problems of fields the file leaves out (line 0) last.
	sort.SliceStable(out, func(i, j int) bool {
		li, lj := out[i].Line, out[j].Line
		return li != 0 && (lj == 0 || li < lj)
	})
	return out
}

// lineIndex maps a field path ("tenants[0].queue.max_wait") to the line
// that sets it.
type lineIndex map[string]int

func indexLines(root *yaml.Node) lineIndex {
	idx := lineIndex{}
	seen := 0
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		if seen++; seen > maxNodes {
			return
		}
		switch n.Kind { // an alias is not followed: its fields' lines are its anchor's
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := join(path, n.Content[i].Value)
				if _, dup := idx[p]; !dup {
					idx[p] = n.Content[i].Line
				}
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				idx[p] = c.Line
				walk(c, p)
			}
		}
	}
	walk(root, "")
	return idx
}

// line is the line of path, or of its nearest ancestor the file sets.
func (idx lineIndex) line(path string) int {
	for path != "" {
		if l, ok := idx[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// leadingPath is the field path a validation message starts with.
func leadingPath(msg string) string {
	p, _, _ := strings.Cut(msg, " ")
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '[' || r == ']') {
			return ""
		}
	}
	return p
}

// covers reports whether a problem at path a makes one at path b moot
// (b is a or lies under it).
func covers(a, b string) bool {
	return a != "" && (a == b || strings.HasPrefix(b, a+".") || strings.HasPrefix(b, a+"["))
}

// flatten splits joined errors into their leaves.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, c := range j.Unwrap() {
			out = append(out, flatten(c)...)
		}
		return out
	}
	return []error{err}
}

// located turns errors whose message starts with a field path into
// Problems carrying that field's line; problems under a path in skip (a
// field that already has a shape problem) are dropped.
func (idx lineIndex) located(err error, skip []Problem) []error {
	var out []error
next:
	for _, e := range flatten(err) {
		var p Problem
		if errors.As(e, &p) {
			out = append(out, p)
			continue
		}
		msg := e.Error()
		path := leadingPath(msg)
		for _, s := range skip {
			if covers(s.Path, path) {
				continue next
			}
		}
		out = append(out, Problem{Path: path, Line: idx.line(path), Msg: msg})
	}
	return out
}

// Warnings lists what is valid but probably a mistake: two replicas with
// the same URL (one server counted twice: its capacity and batch slots
// double-booked, its load split between two names).
func (f *File) Warnings() []Problem {
	var out []Problem
	seen := map[string]int{}
	for i, r := range f.Upstream.Replicas {
		key := normalURL(r.URL)
		if key == "" {
			continue
		}
		path := fmt.Sprintf("upstream.replicas[%d].url", i)
		if j, dup := seen[key]; dup {
			out = append(out, Problem{Path: path, Line: f.lines.line(path),
				Msg: fmt.Sprintf("%s %q is the same server as upstream.replicas[%d] (%s): its capacity would be counted twice", path, r.URL, j, f.Upstream.Replicas[j].Name)})
			continue
		}
		seen[key] = i
	}
	return out
}

// normalURL is a replica URL in a form where spellings of one server
// compare equal: lower-case scheme and host, default port, no trailing
// slash.
func normalURL(s string) string {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || u.Host == "" {
		return ""
	}
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname())
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + host + ":" + port + strings.TrimRight(u.EscapedPath(), "/")
}

// suggestKey is a "did you mean" for an unknown key, or "".
func suggestKey(k string, fields map[string]reflect.StructField) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	if s := suggest.Closest(k, names); s != "" {
		return fmt.Sprintf(" (did you mean %s?)", s)
	}
	return ""
}
