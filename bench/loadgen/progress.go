package loadgen

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// progress keeps live counters and an interval TTFT histogram for the
// --progress line. Counters are atomic; mu guards ttft.
type progress struct {
	offered, sent, done, rejected atomic.Int64

	mu   sync.Mutex
	ttft *hdrhistogram.Histogram // µs, this interval
}

func (p *progress) record(rec *Record) {
	p.done.Add(1)
	if rec.Outcome == Rejected {
		p.rejected.Add(1)
	}
	if rec.First >= 0 && rec.Sent >= 0 {
		p.mu.Lock()
		if p.ttft == nil {
			p.ttft = hdrhistogram.New(1, int64(10*time.Minute/time.Microsecond), 3)
		}
		_ = p.ttft.RecordValue(int64(rec.TTFT() / time.Microsecond))
		p.mu.Unlock()
	}
}

// run prints a line every interval until done closes.
func (p *progress) run(done <-chan struct{}, r *runner, total int) {
	t := time.NewTicker(r.cfg.ProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		p.mu.Lock()
		h := p.ttft
		p.ttft = nil
		p.mu.Unlock()
		var p50, p99 float64
		if h != nil {
			p50 = float64(h.ValueAtQuantile(50)) / 1000
			p99 = float64(h.ValueAtQuantile(99)) / 1000
		}
		sent, done := p.sent.Load(), p.done.Load()
		fmt.Fprintf(r.cfg.Progress, "[%6.1fs] offered %d/%d sent %d in flight %d done %d rejected %d | TTFT p50 %.0f ms p99 %.0f ms\n",
			r.now().Seconds(), p.offered.Load(), total, sent, max(sent-done, 0), done, p.rejected.Load(), p50, p99)
	}
}
