package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// TestMeta pins what the edge is told beside an answer: the grant's
// headroom as of now, the timings between arrival, dispatch and the first
// byte, the output cap's reason and a stop's header.
func TestMeta(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := &Engine{now: func() time.Time { return t0 }}
	var room ledger.Headroom
	room[ledger.Tokens] = ledger.Room{Tracked: true, Limit: 1000, Remaining: 250, ResetsAt: t0.Add(90*time.Second + 1500*time.Microsecond)}
	room[ledger.Requests] = ledger.Room{Tracked: true, Limit: 10, Remaining: 0, ResetsAt: t0.Add(time.Hour)}
	c := &call{t: &policy.Tenant{}, arrival: t0.Add(-2 * time.Millisecond), dispatchAt: t0.Add(-500 * time.Microsecond),
		firstByte: t0.Add(-249*time.Microsecond - 999*time.Nanosecond), grant: ledger.Grant{Headroom: room},
		req: &vllm.Request{}, plan: vllm.Plan{Cap: 16}}
	m := s.meta(c)
	assert.Equal(t, Meta{Sent: true, OutputCap: 16, Queue: 1500 * time.Microsecond, Upstream: 250*time.Microsecond + time.Nanosecond, Answered: true,
		Tokens:   Headroom{Tracked: true, Limit: 1000, Remaining: 250, ResetsIn: 90*time.Second + 1500*time.Microsecond},
		Requests: Headroom{Tracked: true, Limit: 10, ResetsIn: time.Hour}}, m)

	// Never dispatched: no timings, no headroom tracked.
	c = &call{t: &policy.Tenant{}, arrival: t0, req: &vllm.Request{}}
	m = s.meta(c)
	assert.Equal(t, Meta{Sent: true}, m)

	// A warned grant, a cap lowered to a budget, a generation stopped.
	c = &call{t: &policy.Tenant{}, arrival: t0, req: &vllm.Request{}, plan: vllm.Plan{Cap: 16}, capReason: "budget",
		grant:  ledger.Grant{Warnings: []ledger.Warning{{}}},
		growth: &growth{stop: &growStop{reason: "budget", denied: &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Window: time.Hour}}}}
	m = s.meta(c)
	assert.True(t, m.Warning)
	assert.Equal(t, "budget", m.CapReason)
	assert.Equal(t, "budget; scope=tenant; dimension=tokens; window=1h", string(m.Stopped))
}

// A replica's 404 to a call (it no longer serves the model: an adapter
// unloaded) is the client's as vLLM sent it, and has the replica's models
// read again.
func TestUpstream404RereadsModels(t *testing.T) {
	body := []byte(`{"object":"error","message":"The model does not exist."}`)
	up := &lifecycletest.Upstream{Fail: &vllm.UpstreamError{Replica: "r0", Status: 404, Body: body}}
	s, led := otherServer(t, "", up)
	for _, r := range s.reps.List() {
		r.ModelsAt.Store(1)
	}
	_, err := serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
	assert.Equal(t, 404, apierr.For(err).Status)
	assert.Equal(t, body, apierr.For(err).Raw)
	for _, r := range s.reps.List() {
		assert.Zero(t, r.ModelsAt.Load(), "replica %s's models are read again", r.Name)
	}
	assert.Equal(t, 1, led.N("release")+led.N("settle"))
}
