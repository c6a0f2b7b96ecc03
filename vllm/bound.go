package vllm

// The bytes bound of the non-generation endpoints' inputs, and the checks
// that make the body Sluice sizes the body vLLM runs.

// bound sums what a JSON value can contribute to a prompt.
type bound struct {
	bytes, strings, ints int
	media                int // media parts (images, audio, video, files)
	items                int // top-level array elements (1 for a scalar)
	maxItem              int // largest top-level element's bytes + ints
}

func (b *bound) add(o bound) {
	b.bytes += o.bytes
	b.strings += o.strings
	b.ints += o.ints
	b.media += o.media
}

// tokens is the bound's prompt tokens with media parts at perMedia each.
func (b bound) tokens(perMedia int) int { return b.bytes + b.ints + b.media*perMedia }

// mediaTypes are the content-part types whose tokens come from a model's
// processor, not from their bytes: chat's image_url, audio_url, video_url,
// input_audio, image_embeds and file parts, and the Responses API's
// input_image, input_audio and input_file (vllm/entrypoints/chat_utils.py,
// the parsers of MM_PARSER_MAP; vllm/entrypoints/openai/responses).
var mediaTypes = map[string]bool{
	"image_url": true, "audio_url": true, "video_url": true, "input_audio": true,
	"image_embeds": true, "image": true, "audio": true, "video": true, "file": true,
	"image_pil": true, "audio_embeds": true,
	"input_image": true, "input_file": true, "input_video": true,
}

// boundOf walks the value at v once: decoded string bytes, string count,
// scalar count (a token id each) and media parts. An object whose "type"
// is a media type, or that carries a media member without a text type, is
// one media part, whatever its bytes (a data: URL's base64 says nothing of
// its tokens). The walk is linear in the value's size: each byte is read
// once, however deep the nesting.
func boundOf(b []byte, v span) bound {
	if b[v.start] == '[' {
		var out bound
		i := skipSpace(b, v.start+1)
		if i < len(b) && b[i] == ']' {
			return out
		}
		for i < v.end {
			e, sub, err := walkBound(b, i, 1)
			if err != nil {
				return out
			}
			out.add(sub)
			out.items++
			out.maxItem = max(out.maxItem, sub.bytes+sub.ints)
			i = skipSpace(b, e)
			if i >= len(b) || b[i] != ',' {
				break
			}
			i = skipSpace(b, i+1)
		}
		return out
	}
	_, out, _ := walkBound(b, v.start, 1)
	out.items, out.maxItem = 1, out.bytes+out.ints
	return out
}

// walkBound bounds the value at b[i] and returns the index past it. The
// body was validated before (validJSON or json.Valid, then the top-level
// member scan to maxDepth), so an error here is unreachable for admitted
// bodies; it still stops the walk rather than loop.
func walkBound(b []byte, i, depth int) (int, bound, error) {
	var out bound
	if i >= len(b) || depth > maxDepth {
		return 0, out, errScan
	}
	switch c := b[i]; c {
	case '"':
		end, _, err := skipString(b, i)
		if err != nil {
			return 0, out, err
		}
		n, _ := stringLen(b[i:end])
		out.bytes, out.strings = n, 1
		return end, out, nil
	case '[':
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, out, nil
		}
		for {
			end, sub, err := walkBound(b, i, depth+1)
			if err != nil {
				return 0, out, err
			}
			out.add(sub)
			i = skipSpace(b, end)
			if i >= len(b) {
				return 0, out, errScan
			}
			if b[i] == ']' {
				return i + 1, out, nil
			}
			if b[i] != ',' {
				return 0, out, errScan
			}
			i = skipSpace(b, i+1)
		}
	case '{':
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, out, nil
		}
		media, text := false, false
		for {
			kEnd, _, err := skipString(b, i)
			if err != nil {
				return 0, out, err
			}
			key := member{keyStart: i, keyEnd: kEnd}
			i = skipSpace(b, kEnd)
			if i >= len(b) || b[i] != ':' {
				return 0, out, errScan
			}
			i = skipSpace(b, i+1)
			vStart := i
			end, sub, err := walkBound(b, i, depth+1)
			if err != nil {
				return 0, out, err
			}
			key.keyEsc = hasEscape(b[key.keyStart:key.keyEnd])
			switch {
			case key.keyIs(b, "type") && b[vStart] == '"':
				if t, err := unquoteJSON(b[vStart:end]); err == nil {
					media = media || mediaTypes[t]
					text = text || t == "text" || t == "input_text" || t == "output_text"
				}
			case mediaMember(b, key):
				media = true
			}
			out.add(sub)
			i = skipSpace(b, end)
			if i >= len(b) {
				return 0, out, errScan
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return 0, out, errScan
			}
			i = skipSpace(b, i+1)
		}
		if media && !text {
			// One part; any media nested inside it is the same part.
			return i, bound{media: 1}, nil
		}
		return i, out, nil
	}
	// number, true, false, null: a token id, or a literal.
	end, err := skipValueDepth(b, i, depth)
	if err != nil {
		return 0, out, err
	}
	if c := b[i]; c != 'n' {
		out.ints = 1
	}
	return end, out, nil
}

// mediaMember reports a member that carries media whatever the part's type
// says (vLLM's parsers accept parts keyed by their media member).
func mediaMember(b []byte, m member) bool {
	for _, k := range [...]string{"image_url", "audio_url", "video_url", "input_audio", "image_embeds", "file_data", "file_id"} {
		if m.keyIs(b, k) {
			return true
		}
	}
	return false
}

func hasEscape(s []byte) bool {
	for _, c := range s {
		if c == '\\' {
			return true
		}
	}
	return false
}

// topMembers reads the top-level members of the object at b[i]: every key
// decoded, its value's span. A body Sluice cannot read whole is refused,
// not forwarded: a member nested past the scanner's depth, or a key that
// appears twice (vLLM's json.loads keeps the last, and a scanner that kept
// another would size one request and forward another).
func topMembers(b []byte, i int) (map[string]span, error) {
	fields := make(map[string]span, 8)
	var ferr error
	err := eachMember(b, i, func(m member) bool {
		k, err := unquoteJSON(b[m.keyStart:m.keyEnd])
		if err != nil {
			ferr = invalid("", "body has a key that is not a valid JSON string")
			return false
		}
		if _, dup := fields[k]; dup {
			ferr = invalid(k, "appears more than once in the body")
			return false
		}
		fields[k] = span{m.valStart, m.valEnd}
		return true
	})
	if ferr != nil {
		return nil, ferr
	}
	if err != nil {
		return nil, invalid("", tooDeep)
	}
	return fields, nil
}

// tooDeep is the refusal of a body the scanner cannot read whole.
const tooDeep = "body is not a JSON object Sluice can read (nesting deeper than 512 levels?)"

// dupKey reports the first key that appears twice among ms (keys decoded,
// so an escaped spelling of a name is the same name, as in json.loads).
func dupKey(b []byte, ms []member) (string, bool) {
	if len(ms) > 32 {
		seen := make(map[string]bool, len(ms))
		for _, m := range ms {
			k, _ := unquoteJSON(b[m.keyStart:m.keyEnd])
			if seen[k] {
				return k, true
			}
			seen[k] = true
		}
		return "", false
	}
	for i := 1; i < len(ms); i++ {
		for j := 0; j < i; j++ {
			if sameKey(b, ms[i], ms[j]) {
				k, _ := unquoteJSON(b[ms[i].keyStart:ms[i].keyEnd])
				return k, true
			}
		}
	}
	return "", false
}

func sameKey(b []byte, x, y member) bool {
	if !x.keyEsc && !y.keyEsc {
		return string(b[x.keyStart:x.keyEnd]) == string(b[y.keyStart:y.keyEnd])
	}
	kx, err1 := unquoteJSON(b[x.keyStart:x.keyEnd])
	ky, err2 := unquoteJSON(b[y.keyStart:y.keyEnd])
	return err1 == nil && err2 == nil && kx == ky
}
