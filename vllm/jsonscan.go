package vllm

import (
	"bytes"
	"errors"
	"unicode/utf8"
)

// A tiny, allocation-free JSON scanner for the few places where decoding with
// encoding/json would cost too much (one upstream chunk per token) or would lose
// the byte layout that must be passed through unchanged (request rewriting).
// It never panics on malformed input; callers that need strict validity run
// json.Valid first.

var errScan = errors.New("malformed JSON")

// maxDepth bounds nesting so that hostile input cannot blow the stack.
const maxDepth = 512

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index just past the closing quote of the string that
// starts at b[i] == '"', and whether it contained escapes.
func skipString(b []byte, i int) (int, bool, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, false, errScan
	}
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false, errScan
		}
		q := j + k
		n := 0 // backslashes right before the quote
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, bytes.IndexByte(b[i+1:q], '\\') >= 0, nil
		}
		j = q + 1
	}
}

func skipValueDepth(b []byte, i, depth int) (int, error) {
	return scanValue(b, i, depth, false)
}

// validJSON reports whether b is one valid JSON value (surrounding
// whitespace allowed), as json.Valid does, without allocating. It gives up
// (false) past maxDepth nesting; callers then fall back to encoding/json.
func validJSON(b []byte) bool {
	i, err := scanValue(b, skipSpace(b, 0), 0, true)
	return err == nil && skipSpace(b, i) == len(b)
}

// scanValue is the one grammar of the request and chunk paths: it returns
// the index just past the value at b[i]. Loose (strict false), a string is
// found by its closing quote and a scalar by the delimiter that ends it,
// which is all that locating members needs. Strict, every string, number
// and literal is checked as json.Valid checks it, so one walk both
// validates a body and is the same structure the member scanner reads.
func scanValue(b []byte, i, depth int, strict bool) (int, error) {
	if i >= len(b) || depth > maxDepth {
		return 0, errScan
	}
	switch c := b[i]; c {
	case '"':
		if strict {
			return validString(b, i)
		}
		end, _, err := skipString(b, i)
		return end, err
	case '{', '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1, nil
		}
		for {
			if c == '{' {
				var end int
				var err error
				if strict {
					end, err = validString(b, i)
				} else {
					end, _, err = skipString(b, i)
				}
				if err != nil {
					return 0, err
				}
				i = skipSpace(b, end)
				if i >= len(b) || b[i] != ':' {
					return 0, errScan
				}
				i = skipSpace(b, i+1)
			}
			end, err := scanValue(b, i, depth+1, strict)
			if err != nil {
				return 0, err
			}
			i = skipSpace(b, end)
			if i >= len(b) {
				return 0, errScan
			}
			if b[i] == closer {
				return i + 1, nil
			}
			if b[i] != ',' {
				return 0, errScan
			}
			i = skipSpace(b, i+1)
		}
	}
	if strict {
		return validScalar(b, i)
	}
	j := i // number, true, false, null: up to the delimiter
	for j < len(b) {
		c := b[j]
		if c == ',' || c == '}' || c == ']' || isSpace(c) {
			break
		}
		j++
	}
	if j == i {
		return 0, errScan
	}
	return j, nil
}

func validScalar(b []byte, i int) (int, error) {
	switch b[i] {
	case 't':
		return validLit(b, i, "true")
	case 'f':
		return validLit(b, i, "false")
	case 'n':
		return validLit(b, i, "null")
	}
	return validNumber(b, i)
}

func validLit(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, errScan
	}
	return i + len(lit), nil
}

// validString checks what skipString does not: no raw control characters
// and only JSON's escapes. Invalid UTF-8 passes, as in json.Valid.
func validString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, errScan
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, nil
		case c < 0x20:
			return 0, errScan
		case c == '\\':
			i++
			if i >= len(b) {
				return 0, errScan
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return 0, errScan
				}
				if _, ok := hex4(b[i+1 : i+5]); !ok {
					return 0, errScan
				}
				i += 4
			default:
				return 0, errScan
			}
		}
	}
	return 0, errScan
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func validNumber(b []byte, i int) (int, error) {
	digits := func() bool {
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		return true
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return 0, errScan
	case b[i] == '0':
		i++
	case !digits():
		return 0, errScan
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return 0, errScan
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return 0, errScan
		}
	}
	return i, nil
}

// member is one top-level member of a JSON object: the byte offsets of its key
// (including quotes) and of its value. start is the first byte of the key;
// end is one past the value.
type member struct {
	keyStart, keyEnd int
	valStart, valEnd int
	keyEsc           bool
}

// eachMember calls fn for every member of the object that starts at b[i]
// (after optional whitespace). fn returns false to stop early.
func eachMember(b []byte, i int, fn func(m member) bool) error {
	return eachMemberVal(b, i, nil, fn)
}

// eachMemberVal is eachMember where val, when not nil, finds the end of a
// member's value (m.valEnd is not set yet) in place of skipping it, so that
// one pass both reads a value and finds its end.
func eachMemberVal(b []byte, i int, val func(m member) (int, error), fn func(m member) bool) error {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != '{' {
		return errScan
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for {
		var m member
		m.keyStart = i
		end, esc, err := skipString(b, i)
		if err != nil {
			return err
		}
		m.keyEnd, m.keyEsc = end, esc
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return errScan
		}
		i = skipSpace(b, i+1)
		m.valStart = i
		if val != nil {
			end, err = val(m)
		} else {
			end, err = skipValueDepth(b, i, 1)
		}
		if err != nil {
			return err
		}
		m.valEnd = end
		if !fn(m) {
			return nil
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return errScan
		}
		if b[i] == '}' {
			return nil
		}
		if b[i] != ',' {
			return errScan
		}
		i = skipSpace(b, i+1)
	}
}

// eachElement calls fn with the span of every element of the array at b[i].
func eachElement(b []byte, i int, fn func(start, end int) bool) error {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != '[' {
		return errScan
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for {
		end, err := skipValueDepth(b, i, 1)
		if err != nil {
			return err
		}
		if !fn(i, end) {
			return nil
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return errScan
		}
		if b[i] == ']' {
			return nil
		}
		if b[i] != ',' {
			return errScan
		}
		i = skipSpace(b, i+1)
	}
}

// keyIs reports whether the member's key equals name. Escaped keys are
// decoded first (rare; allocates).
func (m member) keyIs(b []byte, name string) bool {
	raw := b[m.keyStart+1 : m.keyEnd-1]
	if !m.keyEsc {
		return string(raw) == name
	}
	s, err := unquoteJSON(b[m.keyStart:m.keyEnd])
	return err == nil && s == name
}

// parseInt parses a JSON integer value (no fraction, no exponent).
func parseInt(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 20 {
		return 0, false
	}
	neg := false
	i := 0
	if v[0] == '-' {
		neg = true
		i = 1
		if len(v) == 1 {
			return 0, false
		}
	}
	var n int64
	for ; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	if neg {
		n = -n
	}
	return n, true
}

// stringLen returns the number of UTF-8 bytes of the decoded JSON string
// literal s (including its quotes), without allocating.
func stringLen(s []byte) (int, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return 0, errScan
	}
	n := 0
	for i := 1; i < len(s)-1; i++ {
		if s[i] != '\\' {
			n++
			continue
		}
		i++
		if i >= len(s)-1 {
			return 0, errScan
		}
		if s[i] != 'u' {
			n++
			continue
		}
		if i+4 >= len(s)-1 {
			return 0, errScan
		}
		r, ok := hex4(s[i+1 : i+5])
		if !ok {
			return 0, errScan
		}
		i += 4
		if r >= 0xD800 && r < 0xDC00 && i+6 < len(s)-1 && s[i+1] == '\\' && s[i+2] == 'u' {
			if r2, ok := hex4(s[i+3 : i+7]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
				n += 4
				i += 6
				continue
			}
		}
		if r >= 0xD800 && r < 0xE000 {
			n += 3 // lone surrogate becomes U+FFFD
			continue
		}
		n += utf8.RuneLen(rune(r))
	}
	return n, nil
}

func hex4(b []byte) (int, bool) {
	if len(b) != 4 {
		return 0, false
	}
	v := 0
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | int(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// unquoteJSON decodes a JSON string literal (allocates).
func unquoteJSON(s []byte) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", errScan
	}
	out := make([]byte, 0, len(s))
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(s)-1 {
			return "", errScan
		}
		switch s[i] {
		case '"', '\\', '/':
			out = append(out, s[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if i+5 > len(s)-1 {
				return "", errScan
			}
			r, ok := hex4(s[i+1 : i+5])
			if !ok {
				return "", errScan
			}
			i += 4
			if r >= 0xD800 && r < 0xDC00 && i+6 < len(s)-1 && s[i+1] == '\\' && s[i+2] == 'u' {
				if r2, ok := hex4(s[i+3 : i+7]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
					out = utf8.AppendRune(out, rune((r-0xD800)<<10|(r2-0xDC00))+0x10000)
					i += 6
					continue
				}
			}
			out = utf8.AppendRune(out, rune(r))
		default:
			return "", errScan
		}
	}
	return string(out), nil
}
