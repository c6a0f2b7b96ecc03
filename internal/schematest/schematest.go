// Package schematest validates documents against the JSON Schema subset
// that Sluice's benchmark results use; only tests import it.
package schematest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
)

// ValidateSchema checks doc against a JSON Schema (the subset that
// result.schema.json uses: type, required, properties, patternProperties,
// additionalProperties, items, enum, const, minimum, maximum,
// exclusiveMinimum, allOf, anyOf and local $ref). It returns every
// violation, each with its JSON path.
func ValidateSchema(schema []byte, doc any) error {
	var root map[string]any
	if err := json.Unmarshal(schema, &root); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	var errs []error
	validate(root, root, v, "$", &errs)
	return errors.Join(errs...)
}

func typeOK(t string, v any) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f)
	}
	return false
}

func validate(root, s map[string]any, v any, path string, errs *[]error) {
	fail := func(format string, a ...any) { *errs = append(*errs, fmt.Errorf(path+": "+format, a...)) }
	if ref, ok := s["$ref"].(string); ok {
		target := root
		for _, p := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			target, _ = target[p].(map[string]any)
		}
		if target == nil {
			fail("unresolved $ref %s", ref)
			return
		}
		validate(root, target, v, path, errs)
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, sub := range all {
			validate(root, sub.(map[string]any), v, path, errs)
		}
	}
	if anyOf, ok := s["anyOf"].([]any); ok {
		matched := false
		for _, sub := range anyOf {
			var e []error
			validate(root, sub.(map[string]any), v, path, &e)
			if len(e) == 0 {
				matched = true
				break
			}
		}
		if !matched {
			fail("matches no anyOf branch")
		}
	}
	switch t := s["type"].(type) {
	case string:
		if !typeOK(t, v) {
			fail("want %s, got %T", t, v)
			return
		}
	case []any:
		ok := false
		for _, x := range t {
			ok = ok || typeOK(x.(string), v)
		}
		if !ok {
			fail("want one of %v, got %T", t, v)
			return
		}
	}
	if c, ok := s["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		fail("want %v, got %v", c, v)
	}
	if e, ok := s["enum"].([]any); ok {
		found := false
		for _, x := range e {
			found = found || fmt.Sprint(x) == fmt.Sprint(v)
		}
		if !found {
			fail("%v not in %v", v, e)
		}
	}
	if f, ok := v.(float64); ok {
		if m, ok := s["minimum"].(float64); ok && f < m {
			fail("%v < minimum %v", f, m)
		}
		if m, ok := s["maximum"].(float64); ok && f > m {
			fail("%v > maximum %v", f, m)
		}
		if m, ok := s["exclusiveMinimum"].(float64); ok && f <= m {
			fail("%v <= exclusiveMinimum %v", f, m)
		}
	}
	if arr, ok := v.([]any); ok {
		if items, ok := s["items"].(map[string]any); ok {
			for i, x := range arr {
				validate(root, items, x, fmt.Sprintf("%s[%d]", path, i), errs)
			}
		}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return
	}
	if req, ok := s["required"].([]any); ok {
		for _, k := range req {
			if _, present := obj[k.(string)]; !present {
				fail("missing required %q", k)
			}
		}
	}
	props, _ := s["properties"].(map[string]any)
	pats, _ := s["patternProperties"].(map[string]any)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sub := path + "." + k
		matched := false
		if ps, ok := props[k].(map[string]any); ok {
			matched = true
			validate(root, ps, obj[k], sub, errs)
		}
		for pat, ps := range pats {
			re, err := regexp.Compile(pat)
			if err != nil {
				fail("bad pattern %q: %v", pat, err)
				continue
			}
			if re.MatchString(k) {
				matched = true
				validate(root, ps.(map[string]any), obj[k], sub, errs)
			}
		}
		if matched {
			continue
		}
		switch ap := s["additionalProperties"].(type) {
		case bool:
			if !ap {
				fail("unexpected property %q", k)
			}
		case map[string]any:
			validate(root, ap, obj[k], sub, errs)
		}
	}
}
