package fleet

import (
	"slices"
	"time"

	"github.com/sluicehq/sluice/vllm"
)

// scrapeFail is a replica's last failed poll (/metrics, /health) or
// /v1/models read. Immutable. Its messages come from vllm.ShowError: no
// URL userinfo, no credential.
type scrapeFail struct {
	at     time.Time
	failed []vllm.ScrapeFailure
	// current: the latest attempt at those endpoints failed too.
	current bool
}

// NotePoll records snap's last failure (from the centre's Observe goroutine).
func (r *Replica) NotePoll(snap *vllm.Replica) {
	if snap.FailedAt.IsZero() {
		return
	}
	cur := snap.Failures > 0
	if p := r.pollFail.Load(); p != nil && p.at.Equal(snap.FailedAt) && p.current == cur {
		return
	}
	r.pollFail.Store(&scrapeFail{at: snap.FailedAt, failed: snap.Failed, current: cur})
}

// NoteModels records the outcome of a /v1/models read at now.
func (r *Replica) NoteModels(err error, now time.Time) {
	if err != nil {
		r.modelsFail.Store(&scrapeFail{at: now, current: true,
			failed: []vllm.ScrapeFailure{{Endpoint: "/v1/models", Message: vllm.ShowError(err)}}})
		return
	}
	if p := r.modelsFail.Load(); p != nil && p.current {
		r.modelsFail.Store(&scrapeFail{at: p.at, failed: p.failed})
	}
}

// ScrapeErrorReport is a replica's last scrape error on the status page.
type ScrapeErrorReport struct {
	At   time.Time `json:"at"`
	AgoS int64     `json:"ago_s"`
	// Current: the latest attempt at these endpoints failed too; false
	// once they answered again (the error is kept to be seen).
	Current bool `json:"current"`
	// Failed names each endpoint that failed (/metrics, /health,
	// /v1/models) with its cause.
	Failed []vllm.ScrapeFailure `json:"failed"`
}

// LastScrapeError is r's most recent scrape error, nil if none since the
// process started. A failure still current on the other side (a failing
// poll and a failing /v1/models read) is shown with it.
func (r *Replica) LastScrapeError(now time.Time) *ScrapeErrorReport {
	p, m := r.pollFail.Load(), r.modelsFail.Load()
	if p == nil && m == nil {
		return nil
	}
	if p == nil || (m != nil && m.at.After(p.at)) {
		p, m = m, p
	}
	out := &ScrapeErrorReport{At: p.at.UTC(), AgoS: int64(now.Sub(p.at) / time.Second), Current: p.current, Failed: slices.Clone(p.failed)}
	if m != nil && m.current {
		out.Failed = append(out.Failed, m.failed...)
	}
	return out
}
