package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"time"
)

// MaxLine bounds one SSE line (1 MiB); a longer line ends the stream with
// [ErrLineTooLong].
const MaxLine = 1 << 20

// ErrLineTooLong reports an SSE line over [MaxLine].
var ErrLineTooLong = errors.New("sse line over 1 MiB")

// Event is one server-sent event: its data lines joined by "\n", stamped
// when its first line arrived. Comment-only events have Keepalive set.
// Data is only valid until the next call to [SSEReader.Next].
type Event struct {
	Data      []byte
	At        time.Duration
	Keepalive bool
}

// SSEReader splits a text/event-stream into events. It accepts LF and CRLF,
// joins multiple data lines, treats ":" lines as keepalives and ignores other
// fields. Not safe for concurrent use.
type SSEReader struct {
	br   *bufio.Reader
	now  func() time.Duration
	buf  []byte
	data []byte // reused for Event.Data
}

// NewSSEReader reads events from r, stamping them with now.
func NewSSEReader(r io.Reader, now func() time.Duration) *SSEReader {
	return &SSEReader{br: bufio.NewReaderSize(r, 4<<10), now: now}
}

func (s *SSEReader) line() ([]byte, error) {
	s.buf = s.buf[:0]
	for {
		chunk, err := s.br.ReadSlice('\n')
		s.buf = append(s.buf, chunk...)
		if len(s.buf) > MaxLine {
			return nil, ErrLineTooLong
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return s.buf, err
		}
		return s.buf, nil
	}
}

// Next returns the next event. At the end of the stream it returns io.EOF
// (after a final event without a trailing blank line, if any); other errors
// are the transport's.
func (s *SSEReader) Next() (Event, error) {
	ev := Event{Data: s.data[:0]}
	defer func() { s.data = ev.Data[:0] }()
	started, hasData := false, false
	for {
		l, err := s.line()
		if len(l) > 0 && !started {
			started = true
			ev.At = s.now()
		}
		t := bytes.TrimRight(l, "\r\n")
		if len(t) == 0 {
			if hasData || ev.Keepalive {
				return ev, nil
			}
			if err != nil {
				return Event{}, err
			}
			started = false
			continue
		}
		if t[0] == ':' {
			ev.Keepalive = !hasData
		} else if field, val, _ := bytes.Cut(t, []byte{':'}); bytes.Equal(field, []byte("data")) {
			val = bytes.TrimPrefix(val, []byte{' '})
			if hasData {
				ev.Data = append(ev.Data, '\n')
			}
			ev.Data = append(ev.Data, val...)
			ev.Keepalive = false
			hasData = true
		}
		if err != nil {
			if hasData || ev.Keepalive {
				return ev, nil
			}
			return Event{}, err
		}
	}
}
