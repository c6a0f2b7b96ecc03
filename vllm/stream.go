package vllm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// ChunkUsage is one chunk's "usage" object.
type ChunkUsage struct {
	PromptTokens     int
	CompletionTokens int
	TotalTokens      int
	// CachedTokens is prompt_tokens_details.cached_tokens (0 when absent).
	CachedTokens int
}

// Event is one SSE event of an upstream stream. Its byte slices alias the
// Stream's buffers and are valid only until the next call to Next.
type Event struct {
	// Raw is the event exactly as received, with its terminating blank line:
	// what a streaming client gets when the event is passed through.
	Raw []byte
	// Data is the event's data (data lines joined by "\n").
	Data []byte
	// Done reports "data: [DONE]".
	Done bool
	// Final reports the "choices": [] chunk carrying the final usage.
	Final bool
	// HasUsage reports a non-null "usage" object in the chunk.
	HasUsage bool
	// Usage is the chunk's usage when HasUsage. With continuous usage stats
	// its CompletionTokens is cumulative for choice Choice.
	Usage ChunkUsage
	// Choice is the index of the chunk's first choice, -1 when it has none.
	Choice int
	// Finished reports a non-null finish_reason on the chunk's first choice.
	Finished bool
	// Err is set for an SSE error event ({"error": …} or {"object":"error"}).
	Err *UpstreamError
	// Whole reports a non-streamed upstream response: Raw and Data are the
	// whole JSON body, which a non-streaming client gets unchanged, and
	// Usage its usage (Final).
	Whole bool

	// at is where the chunk's first "usage" member lies in Data, found by
	// parseChunk's scan so that ShapeChunk need not scan the chunk again.
	at usageAt
}

// usageAt locates a chunk's first top-level "usage" member: its key and
// value, the end of the member before it (-1: none) and the start of the
// member after it (-1: none). ok reports that a scan filled it in (an Event
// built by hand has none: ShapeChunk scans).
type usageAt struct {
	ok, found          bool
	keyStart, valEnd   int
	valStart           int
	prevEnd, nextStart int
}

// Usage is what a stream has reported so far.
type Usage struct {
	PromptTokens int
	// CompletionTokens is the final usage's value when Final, else the sum
	// over choices of the last cumulative completion_tokens seen.
	CompletionTokens int
	CachedTokens     int
	// Final reports that the final usage chunk arrived: the numbers are
	// vLLM's own totals.
	Final bool
	// Known reports that at least one usage object arrived.
	Known bool
	// Choices is the number of distinct choices that reported usage.
	Choices int
}

// TotalTokens is PromptTokens + CompletionTokens.
func (u Usage) TotalTokens() int { return u.PromptTokens + u.CompletionTokens }

// maxChoices bounds per-choice tracking (n × prompts).
const maxChoices = 1 << 14

// Stream reads an upstream SSE response. It is not safe for concurrent use;
// one goroutine calls Next until it returns an error (io.EOF after [DONE]),
// then Close, which must be called (it releases the request's context).
// Cancelling the context the stream was opened with closes the upstream
// connection (vLLM's abort signal) and makes Next return, after the events
// that had already arrived, the context's error. Usage may be read after
// any Next.
type Stream struct {
	replica string
	body    io.ReadCloser
	cancel  context.CancelFunc // ends the request's own context; nil for NewStream
	// ending reports that the request is being aborted, so that reads no
	// longer wait for the replica (h1Body.ending); nil for NewStream.
	ending   func() bool
	br       *bufio.Reader
	maxEvent int

	buf  []byte // the current event's raw bytes
	data []byte // joined data when an event has several data lines

	done   bool
	err    error
	chunks int

	sawUsage  bool
	prompt    int
	cached    int
	perChoice []int
	// promptOf is the prompt_tokens the choice's chunks reported: vLLM's
	// continuous usage carries the choice's own prompt's count
	// (completion/serving.py num_prompt_tokens[prompt_idx]).
	promptOf []int
	seen     []bool
	finished []bool
	// chunked reports a chunk of the choice, with or without usage.
	chunked  []bool
	nSeen    int
	final    ChunkUsage
	hasFinal bool

	// whole holds a non-streamed response (see Event.Whole).
	whole   []byte
	isWhole bool
	// refused is an error event that came before any chunk: the engine
	// refused the request when it added it (VLLM.md §1.5), so nothing ran.
	refused *UpstreamError

	// src is what br reads: body, with the BeforeRead hook.
	src hookReader
}

// hookReader calls before ahead of every read of r: the read buffer is
// empty (or holds part of an event), so the next read may block.
type hookReader struct {
	r      io.Reader
	before func()
}

func (h *hookReader) Read(p []byte) (int, error) {
	if h.before != nil {
		h.before()
	}
	return h.r.Read(p)
}

// BeforeRead sets f (nil: none) to be called before each read of the
// upstream connection, that is, whenever no whole event is left in the
// stream's read buffer. A streaming client's writer coalesces the events
// already read and writes them there (one write per read, not per event),
// which never delays an event: its bytes go out before Sluice waits on the
// replica again.
func (s *Stream) BeforeRead(f func()) { s.src.before = f }

// NewStream reads SSE from body, attributing errors to replica. maxEventBytes
// ≤ 0 means the default (1 MiB). It is exported for fakes in other packages'
// tests; the scheduler gets its streams from [Client.Stream].
func NewStream(body io.ReadCloser, replica string, maxEventBytes int) *Stream {
	if maxEventBytes <= 0 {
		maxEventBytes = defaultMaxEventBytes
	}
	s := &Stream{
		replica:  replica,
		body:     body,
		maxEvent: maxEventBytes,
		src:      hookReader{r: body},
	}
	br, _ := readerPool.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(&s.src, streamReadBuf)
	} else {
		br.Reset(&s.src)
	}
	s.br = br
	return s
}

// newWholeStream wraps a non-streamed 200 response body: Next returns it
// as one Whole event, then io.EOF.
func newWholeStream(body []byte, replica string) *Stream {
	return &Stream{replica: replica, isWhole: true, whole: body, body: noBody{}}
}

// noBody is a whole stream's body: already read.
type noBody struct{}

func (noBody) Read([]byte) (int, error) { return 0, io.EOF }
func (noBody) Close() error             { return nil }

// streamReadBuf is the size of a Stream's read buffer.
const streamReadBuf = 16 << 10

// readerPool recycles Streams' read buffers: one 16 KiB buffer per request
// was half of the bytes a small request allocated. Close returns it; Events
// never alias it (readEvent copies lines into Stream.buf).
var readerPool sync.Pool

// Replica returns the replica base URL the stream comes from.
func (s *Stream) Replica() string { return s.replica }

// Next returns the next event. It returns io.EOF after [DONE], an error
// wrapping ErrStreamCut if the stream ended without [DONE], the context's
// error after cancellation, or ErrEventTooLarge. Errors are sticky.
func (s *Stream) Next() (Event, error) {
	if s.err != nil {
		return Event{}, s.err
	}
	if s.done {
		s.err = io.EOF
		return Event{}, io.EOF
	}
	if s.isWhole {
		return s.wholeEvent(), nil
	}
	ev, err := s.readEvent()
	if err != nil {
		s.err = err
		return Event{}, err
	}
	return ev, nil
}

func (s *Stream) readEvent() (Event, error) {
	s.buf = s.buf[:0]
	for {
		dataStart, dataEnd, nData := -1, -1, 0
		s.data = s.data[:0]
		for {
			line, err := s.br.ReadSlice('\n')
			if len(s.buf)+len(line) > s.maxEvent {
				return Event{}, fmt.Errorf("upstream %s: %w", s.replica, ErrEventTooLarge)
			}
			lineStart := len(s.buf)
			s.buf = append(s.buf, line...)
			if errors.Is(err, bufio.ErrBufferFull) {
				// Keep reading the same line.
				for errors.Is(err, bufio.ErrBufferFull) {
					line, err = s.br.ReadSlice('\n')
					if len(s.buf)+len(line) > s.maxEvent {
						return Event{}, fmt.Errorf("upstream %s: %w", s.replica, ErrEventTooLarge)
					}
					s.buf = append(s.buf, line...)
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					return Event{}, fmt.Errorf("upstream %s: %w: %w", s.replica, ErrStreamCut, io.ErrUnexpectedEOF)
				}
				return Event{}, fmt.Errorf("upstream %s: read stream: %w", s.replica, err)
			}
			l := s.buf[lineStart:]
			l = bytes.TrimSuffix(l, []byte("\n"))
			l = bytes.TrimSuffix(l, []byte("\r"))
			if len(l) == 0 {
				break // end of event
			}
			if !bytes.HasPrefix(l, []byte("data:")) {
				continue // comment, event:, id:, retry:
			}
			pre := 5
			if len(l) > 5 && l[5] == ' ' {
				pre = 6
			}
			v := l[pre:]
			vs := lineStart + pre
			nData++
			switch nData {
			case 1:
				dataStart, dataEnd = vs, vs+len(v)
			case 2:
				s.data = append(s.data, s.buf[dataStart:dataEnd]...)
				fallthrough
			default:
				s.data = append(s.data, '\n')
				s.data = append(s.data, v...)
			}
		}
		if nData == 0 {
			s.buf = s.buf[:0]
			continue // blank or comment-only event
		}
		data := s.data
		if nData == 1 {
			data = s.buf[dataStart:dataEnd]
		}
		ev := Event{Raw: s.buf, Data: data, Choice: -1}
		if bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
			ev.Done = true
			s.done = true
			return ev, nil
		}
		s.chunks++
		parseChunk(data, &ev, s.replica)
		s.track(&ev)
		return ev, nil
	}
}

// wholeEvent returns the non-streamed body as one event and records its
// usage as final.
func (s *Stream) wholeEvent() Event {
	s.done = true
	ev := Event{Raw: s.whole, Data: s.whole, Whole: true, Choice: -1}
	_ = eachMember(s.whole, skipSpace(s.whole, 0), func(m member) bool {
		if m.keyIs(s.whole, "usage") && s.whole[m.valStart] == '{' {
			ev.HasUsage = parseUsage(s.whole, m.valStart, &ev.Usage)
			return false
		}
		return true
	})
	if ev.HasUsage {
		ev.Final = true
		s.sawUsage = true
		s.final, s.hasFinal = ev.Usage, true
	}
	return ev
}

// parseChunk extracts choices/usage/error from one chunk without allocating
// (except for error events). Malformed JSON leaves the event empty.
func parseChunk(data []byte, ev *Event, replica string) {
	ev.Choice = -1
	emptyChoices := false
	usage := -1
	isErr := false
	at := usageAt{ok: true, prevEnd: -1, nextStart: -1}
	var ch choicesScan // the last "choices" array's scan
	// The choices array is read while its end is found (scanChoices): one
	// walk of the chunk's bulk, not three (skip, element, members).
	val := func(m member) (int, error) {
		if m.valStart < len(data) && data[m.valStart] == '[' && m.keyIs(data, "choices") {
			return scanChoices(data, m.valStart, &ch)
		}
		return skipValueDepth(data, m.valStart, 1)
	}
	_ = eachMemberVal(data, 0, val, func(m member) bool {
		switch {
		case at.found:
			if at.nextStart < 0 {
				at.nextStart = m.keyStart
			}
		case m.keyIs(data, "usage"):
			at.found, at.keyStart, at.valStart, at.valEnd = true, m.keyStart, m.valStart, m.valEnd
		default:
			at.prevEnd = m.valEnd
		}
		switch {
		case m.keyIs(data, "choices"):
			if data[m.valStart] != '[' {
				return true
			}
			if ch.hasIndex {
				ev.Choice = ch.index
			}
			if ch.hasFinish {
				ev.Finished = ch.finished
			}
			emptyChoices = ch.empty
		case m.keyIs(data, "usage"):
			if data[m.valStart] == '{' {
				usage = m.valStart
			}
		case m.keyIs(data, "error"):
			if data[m.valStart] == '{' {
				isErr = true
			}
		case m.keyIs(data, "object"):
			if string(data[m.valStart:m.valEnd]) == `"error"` {
				isErr = true
			}
		}
		return true
	})
	if isErr {
		e := &UpstreamError{Replica: replica, InStream: true, Body: bytes.Clone(data)}
		parseErrorBody(data, e)
		e.Status = codeStatus(e.Code, 500)
		ev.Err = e
		return
	}
	if usage >= 0 {
		ev.HasUsage = parseUsage(data, usage, &ev.Usage)
	}
	ev.Final = emptyChoices && ev.HasUsage
	ev.at = at
}

// choicesScan is what scanChoices read of a choices array: its first
// element's last valid "index" and last "finish_reason", and whether the
// array is empty.
type choicesScan struct {
	index               int
	hasIndex, hasFinish bool
	finished, empty     bool
}

// scanChoices returns the end of the choices array at b[i] == '[', reading
// its first element's index and finish_reason on the way into cs (reset
// first). It fails exactly where skipValueDepth(b, i, 1) does: the same
// nesting depths and the same checks.
func scanChoices(b []byte, i int, cs *choicesScan) (int, error) {
	*cs = choicesScan{}
	j := skipSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		cs.empty = true
		return j + 1, nil
	}
	for first := true; ; first = false {
		var end int
		var err error
		if first && j < len(b) && b[j] == '{' {
			end, err = scanChoice(b, j, cs)
		} else {
			end, err = skipValueDepth(b, j, 2)
		}
		if err != nil {
			return 0, err
		}
		j = skipSpace(b, end)
		if j >= len(b) {
			return 0, errScan
		}
		if b[j] == ']' {
			return j + 1, nil
		}
		if b[j] != ',' {
			return 0, errScan
		}
		j = skipSpace(b, j+1)
	}
}

// scanChoice is skipValueDepth(b, i, 2) of the choice object at b[i] that
// also reads its index and finish_reason.
func scanChoice(b []byte, i int, cs *choicesScan) (int, error) {
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		m := member{keyStart: i}
		end, esc, err := skipString(b, i)
		if err != nil {
			return 0, err
		}
		m.keyEnd, m.keyEsc = end, esc
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return 0, errScan
		}
		i = skipSpace(b, i+1)
		m.valStart = i
		end, err = skipValueDepth(b, i, 3)
		if err != nil {
			return 0, err
		}
		switch {
		case m.keyIs(b, "index"):
			if n, ok := parseInt(b[i:end]); ok && n >= 0 && n < maxCount {
				cs.index, cs.hasIndex = int(n), true
			}
		case m.keyIs(b, "finish_reason"):
			cs.finished, cs.hasFinish = b[i] == '"', true
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return 0, errScan
		}
		if b[i] == '}' {
			return i + 1, nil
		}
		if b[i] != ',' {
			return 0, errScan
		}
		i = skipSpace(b, i+1)
	}
}

func parseUsage(b []byte, at int, u *ChunkUsage) bool {
	ok := false
	_ = eachMember(b, at, func(m member) bool {
		v := b[m.valStart:m.valEnd]
		switch {
		case m.keyIs(b, "prompt_tokens"):
			n, good := parseInt(v)
			if good && n >= 0 && n < maxCount {
				u.PromptTokens = int(n)
				ok = true
			}
		case m.keyIs(b, "completion_tokens"):
			n, good := parseInt(v)
			if good && n >= 0 && n < maxCount {
				u.CompletionTokens = int(n)
				ok = true
			}
		case m.keyIs(b, "total_tokens"):
			if n, good := parseInt(v); good && n >= 0 && n < maxCount {
				u.TotalTokens = int(n)
			}
		case m.keyIs(b, "prompt_tokens_details"):
			if v[0] == '{' {
				_ = eachMember(b, m.valStart, func(dm member) bool {
					if dm.keyIs(b, "cached_tokens") {
						if n, good := parseInt(b[dm.valStart:dm.valEnd]); good && n >= 0 && n < maxCount {
							u.CachedTokens = int(n)
						}
						return false
					}
					return true
				})
			}
		}
		return true
	})
	return ok
}

func (s *Stream) track(ev *Event) {
	if ev.Err != nil {
		if s.chunks == 1 && !s.sawUsage && ev.Err.Status < 500 {
			s.refused = ev.Err
		}
		return
	}
	if ev.Choice >= 0 && ev.Choice < maxChoices {
		s.grow(ev.Choice)
		s.chunked[ev.Choice] = true
		if ev.Finished {
			s.finished[ev.Choice] = true
		}
	}
	if !ev.HasUsage {
		return
	}
	s.sawUsage = true
	if ev.Final {
		s.final, s.hasFinal = ev.Usage, true
		return
	}
	s.prompt = ev.Usage.PromptTokens
	if ev.Usage.CachedTokens > 0 {
		s.cached = ev.Usage.CachedTokens
	}
	c := ev.Choice
	if c < 0 {
		c = 0
	}
	if c >= maxChoices {
		return
	}
	s.grow(c)
	if !s.seen[c] {
		s.seen[c] = true
		s.nSeen++
	}
	s.promptOf[c] = ev.Usage.PromptTokens
	// Cumulative per choice: keep the largest (values never shrink).
	s.perChoice[c] = max(s.perChoice[c], ev.Usage.CompletionTokens)
}

func (s *Stream) grow(c int) {
	if c < len(s.perChoice) {
		return
	}
	n := c + 1 - len(s.perChoice)
	s.perChoice = append(s.perChoice, make([]int, n)...)
	s.promptOf = append(s.promptOf, make([]int, n)...)
	s.seen = append(s.seen, make([]bool, n)...)
	s.finished = append(s.finished, make([]bool, n)...)
	s.chunked = append(s.chunked, make([]bool, n)...)
}

// Settle is [Stream.SettleFor] for a request with one prompt: choices
// sequences, each allowed allowancePerChoice tokens after its last usage and
// capped at capPerChoice; promptTokens is the admission input count.
func (s *Stream) Settle(choices, allowancePerChoice, capPerChoice, promptTokens int) Usage {
	return s.SettleFor(Shape{N: choices, Inputs: []int{promptTokens}, Allowance: allowancePerChoice, Cap: capPerChoice})
}

// Shape is what [Stream.SettleFor] needs to know of the request.
type Shape struct {
	// N is the number of choices per prompt.
	N int
	// Inputs is the admission input count per prompt (one for chat); a
	// prompt none of whose choices reported usage is charged this.
	Inputs []int
	// Allowance is the tokens an unfinished choice may have generated after
	// its last usage: one stream interval (see the scheduler's
	// allowanceFor). A step larger than the interval between two usage
	// chunks is vLLM's API server catching up with outputs it had merged
	// (output_processor.py RequestOutputCollector), not a larger interval,
	// so it does not raise the allowance.
	Allowance int
	// Cap is the per-choice output cap (0: none).
	Cap int
}

// SettleFor returns the usage to charge for a stream that ended, normally or
// early (client disconnect, deadline, cut):
//   - the final usage when it arrived (vLLM's own totals);
//   - nothing when the engine refused the request with an error event
//     before any chunk ([Stream.Refused]): it never ran;
//   - else, per prompt, the prompt_tokens its choices reported (the
//     admission count Inputs[p] if none did), summed over prompts; and per
//     choice (N × prompts): the last cumulative completion_tokens, plus
//     Allowance if it did not finish, capped at Cap. A choice with chunks
//     but no usage at all, or a finished choice without usage (a stream
//     that ended with [DONE] and no usage), is charged Cap: without usage
//     evidence the cap is the honest charge, never 0. A non-streamed
//     response that never came is charged Cap for every choice: vLLM may
//     have generated up to it and reports nothing.
//
// # Design rationale
//
// vLLM reports nothing for an aborted request (VLLM.md §1.4), so the charge
// is an estimate bounded by the reservation. An aborted stream first reads
// the events that had arrived unread (takeArrived): their usage narrows it.
func (s *Stream) SettleFor(sh Shape) Usage {
	s.takeArrived()
	u := s.Usage()
	if u.Final {
		return u
	}
	if s.refused != nil {
		return Usage{}
	}
	prompts := max(1, len(sh.Inputs))
	n := max(1, sh.N)
	choices := max(n*prompts, len(s.perChoice))
	capped := func(v int) int {
		if sh.Cap > 0 {
			return min(v, sh.Cap)
		}
		return v
	}
	u.PromptTokens = 0
	for p := range prompts {
		reported, ok := 0, false
		for c := p * n; c < (p+1)*n && c < len(s.seen); c++ {
			if s.seen[c] {
				reported, ok = s.promptOf[c], true
				break
			}
		}
		switch {
		case ok:
			u.PromptTokens += reported
		case p < len(sh.Inputs):
			u.PromptTokens += sh.Inputs[p]
		}
	}
	u.CompletionTokens = 0
	for c := range choices {
		var v int
		var seen, done, chunked bool
		if c < len(s.perChoice) {
			v, seen, done, chunked = s.perChoice[c], s.seen[c], s.finished[c], s.chunked[c]
		}
		switch {
		case s.isWhole && sh.Cap > 0:
			v = sh.Cap
		case seen && done:
		case seen:
			v = capped(v + sh.Allowance)
		case (chunked || done) && sh.Cap > 0:
			v = sh.Cap
		default:
			v = capped(sh.Allowance)
		}
		u.CompletionTokens += v
	}
	return u
}

// takeArrived reads the events of an aborted stream that the replica had
// sent before the abort and nobody read: its connection hands them over
// without waiting, then ends (connReader). They are not passed on to the
// client (the BeforeRead hook is off meanwhile), but their usage is what
// the GPU ran, and the charge's best evidence.
func (s *Stream) takeArrived() {
	if s.isWhole || s.err != nil || s.done || s.ending == nil || !s.ending() {
		return
	}
	before := s.src.before
	s.src.before = nil
	for {
		if _, err := s.Next(); err != nil {
			break
		}
	}
	s.src.before = before
}

// Refused returns the error event the engine sent instead of any output
// (VLLM.md §1.5: errors after the 200 headers), nil otherwise.
func (s *Stream) Refused() *UpstreamError { return s.refused }

// Usage returns the usage reported so far: the final usage chunk when it
// arrived, else the last cumulative usage (prompt + Σ per-choice last
// completion_tokens). A stream cancelled before any usage reports Known false.
func (s *Stream) Usage() Usage {
	if s.hasFinal {
		return Usage{
			PromptTokens:     s.final.PromptTokens,
			CompletionTokens: s.final.CompletionTokens,
			CachedTokens:     s.final.CachedTokens,
			Final:            true,
			Known:            true,
			Choices:          s.nSeen,
		}
	}
	u := Usage{PromptTokens: s.prompt, CachedTokens: s.cached, Known: s.sawUsage, Choices: s.nSeen}
	for _, n := range s.perChoice {
		u.CompletionTokens += n
	}
	return u
}

// Done reports whether [DONE] arrived.
func (s *Stream) Done() bool { return s.done }

// drainTimeout bounds how long Close waits for the end of a response after
// [DONE] before giving up on reusing the connection.
const drainTimeout = 100 * time.Millisecond

// Close releases the stream. After [DONE] the end of the response is read
// (for at most 100ms) so that the connection can be reused; otherwise the
// connection is closed, which vLLM takes as an abort. Close is idempotent.
func (s *Stream) Close() error {
	if s.body == nil {
		return nil
	}
	s.src.before = nil // the drain below is no client's read
	if s.done && s.br != nil {
		var t *time.Timer
		if s.cancel != nil {
			t = time.AfterFunc(drainTimeout, s.cancel)
		}
		_, _ = io.CopyN(io.Discard, s.br, 4<<10)
		if t != nil {
			t.Stop()
		}
	}
	err := s.body.Close()
	if s.cancel != nil {
		s.cancel()
	}
	s.body = nil
	if s.br != nil { // nil for a whole stream
		s.br.Reset(nil)
		readerPool.Put(s.br)
		s.br = nil
	}
	if s.err == nil {
		s.err = errClosed
	}
	return err
}

var errClosed = errors.New("stream closed")
