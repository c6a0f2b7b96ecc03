package vllm

import "bytes"

// Shaper shapes one upstream stream's events for its streaming client
// ([ShapeChunk]) and restores vLLM's system_fingerprint for a client that
// did not ask for usage. vLLM stamps the fingerprint on each choice's last
// chunk when no usage chunk follows, else on the usage chunk
// (vllm/entrypoints/openai/completion/serving.py); Sluice always asks for
// usage upstream, so for such a client it holds each choice's last chunk
// until the usage chunk shows the fingerprint, and writes them stamped.
// Content is never held: only the chunks carrying a finish_reason, until
// the request's end (with n > 1, an early choice's finish marker then
// comes with the last one's). Not safe for concurrent use.
type Shaper struct {
	r    *Request
	hold bool     // the client gets no usage chunk
	held [][]byte // shaped finish chunks waiting for the fingerprint
}

// NewShaper returns a Shaper for r's stream.
func NewShaper(r *Request) *Shaper {
	wantsUsage := r.HasStreamOptions && r.IncludeUsage
	return &Shaper{r: r, hold: !wantsUsage}
}

// Shape appends to dst what the client gets for ev (possibly nothing, or
// held chunks released with it) and reports whether dst has anything new.
func (s *Shaper) Shape(dst []byte, ev Event) ([]byte, bool) {
	start := len(dst)
	switch {
	case !s.hold:
	case ev.Final:
		fp := memberValue(ev.Data, "system_fingerprint")
		for _, h := range s.held {
			dst = appendStamped(dst, h, fp)
		}
		s.held = nil
	case ev.Finished && ev.Err == nil && !ev.Done:
		out, ok := ShapeChunk(nil, ev, s.r)
		if ok {
			s.held = append(s.held, out)
		}
		return dst, false
	default:
		if ev.Done || ev.Err != nil {
			for _, h := range s.held {
				dst = append(dst, h...)
			}
			s.held = nil
		}
	}
	dst, _ = ShapeChunk(dst, ev, s.r)
	return dst, len(dst) > start
}

// appendStamped appends the shaped chunk h with "system_fingerprint": fp
// added to its object (h as is when fp is empty or null).
func appendStamped(dst, h, fp []byte) []byte {
	end := bytes.LastIndexByte(h, '}')
	if len(fp) == 0 || bytes.Equal(fp, []byte("null")) || end < 0 {
		return append(dst, h...)
	}
	dst = append(dst, h[:end]...)
	dst = append(dst, `,"system_fingerprint":`...)
	dst = append(dst, fp...)
	return append(dst, h[end:]...)
}

// memberValue returns the raw value of a top-level member of a JSON object.
func memberValue(data []byte, name string) []byte {
	var v []byte
	_ = eachMember(data, skipSpace(data, 0), func(m member) bool {
		if m.keyIs(data, name) {
			v = data[m.valStart:m.valEnd]
			return false
		}
		return true
	})
	return v
}
