package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

var (
	durationType  = reflect.TypeFor[time.Duration]()
	apiKeyReflect = reflect.TypeFor[APIKey]()
)

// checkShape walks the YAML tree against File's fields and reports every
// unknown key and wrongly typed value by field path, before decoding. yaml's
// own errors name lines, not paths, and stop at the first unknown key.
func checkShape(root *yaml.Node) []Problem {
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	w := walker{budget: maxNodes}
	w.walk(root, reflect.TypeFor[File](), "")
	return w.errs
}

// maxNodes bounds the walk, so alias bombs cannot blow up checking.
const maxNodes = 100000

type walker struct {
	errs   []Problem
	budget int
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if w.budget--; w.budget < 0 {
		if w.budget == -1 {
			w.errs = append(w.errs, Problem{Line: n.Line, Msg: "config is too large or has too many aliases"})
		}
		return
	}
	errs := &w.errs
	bad := func(want string) {
		*errs = append(*errs, Problem{Path: path, Line: n.Line, Msg: fmt.Sprintf("%s must be %s", orRoot(path), want)})
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // explicit null keeps the default
	}
	if t == durationType {
		if n.Kind != yaml.ScalarNode {
			bad("a duration such as 10s")
			return
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			bad(fmt.Sprintf("a duration such as 10s (got %q)", n.Value))
		}
		return
	}
	if t == apiKeyReflect && n.Kind == yaml.ScalarNode {
		t = reflect.TypeFor[string]() // the bare-hash form of an api_keys entry
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			bad("a mapping")
			return
		}
		fields := map[string]reflect.StructField{}
		for i := range t.NumField() {
			f := t.Field(i)
			if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name != "" && name != "-" {
				fields[name] = f
			}
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			p := join(path, k)
			if seen[k] {
				*errs = append(*errs, Problem{Path: p, Line: n.Content[i].Line, Msg: p + " is set twice"})
			}
			seen[k] = true
			f, ok := fields[k]
			if !ok {
				*errs = append(*errs, Problem{Path: p, Line: n.Content[i].Line, Msg: p + " is not a known key" + suggestKey(k, fields)})
				continue
			}
			w.walk(v, f.Type, p)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			bad("a list")
			return
		}
		for i, c := range n.Content {
			w.walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Style == 0 && n.Tag != "!!int" && n.Tag != "!!float") {
			bad("a string")
		}
	case reflect.Int, reflect.Int64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			bad(fmt.Sprintf("an integer (got %q)", n.Value))
			return
		}
		if _, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err != nil {
			bad(fmt.Sprintf("an integer that fits in 64 bits (got %q)", n.Value))
		}
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			bad(fmt.Sprintf("a number (got %q)", n.Value))
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			bad("true or false")
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(p string) string {
	if p == "" {
		return "the config"
	}
	return p
}
