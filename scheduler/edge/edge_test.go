package edge

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
)

// fakeScheduler is the pipeline as the edge sees it: no call is ever
// started unless a test says so.
type fakeScheduler struct {
	draining, ready bool
	why             string
	authenticated   int
}

func (f *fakeScheduler) Authenticate([]byte) (lifecycle.Caller, error) {
	f.authenticated++
	return lifecycle.Caller{}, apierr.ErrUnauthorized
}
func (f *fakeScheduler) Start(context.Context, lifecycle.Admission) (*lifecycle.Ticket, error) {
	panic("no call starts in these tests")
}
func (f *fakeScheduler) Replayed(lifecycle.Caller, error) ([]byte, bool) { return nil, false }
func (f *fakeScheduler) Reject(_, _ string, err error) *apierr.Error {
	return apierr.For(err)
}
func (f *fakeScheduler) Models(lifecycle.Caller) []byte { return nil }
func (f *fakeScheduler) CreateWorkflow(context.Context, lifecycle.Caller, []byte) ([]byte, error) {
	return nil, nil
}
func (f *fakeScheduler) Workflow(context.Context, lifecycle.Caller, string) ([]byte, error) {
	return nil, nil
}
func (f *fakeScheduler) Draining() bool        { return f.draining }
func (f *fakeScheduler) Traced() bool          { return false }
func (f *fakeScheduler) Ready() (bool, string) { return f.ready, f.why }
func (f *fakeScheduler) ReadyDetail() string   { return "" }
func (f *fakeScheduler) Policy() *config.File  { return &config.File{} }

func handle(e *Edge, method, path string) *fasthttp.Response {
	var rc fasthttp.RequestCtx
	rc.Request.Header.SetMethod(method)
	rc.Request.SetRequestURI(path)
	e.Handle(&rc)
	var out fasthttp.Response
	rc.Response.CopyTo(&out)
	return &out
}

func errorCode(t *testing.T, r *fasthttp.Response) string {
	t.Helper()
	var b struct {
		Error struct{ Code string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.Body(), &b), "%s", r.Body())
	return b.Error.Code
}

// TestEdgeAgainstItsPort: the edge's own answers, against a fake of its
// Scheduler port: a draining pipeline refuses before any key is checked,
// vLLM's /health follows readiness, and an unknown route is the pinned
// 404.
func TestEdgeAgainstItsPort(t *testing.T) {
	s := &fakeScheduler{draining: true, why: "draining"}
	e := New(context.Background(), s, nil)

	r := handle(e, "POST", "/v1/chat/completions")
	assert.Equal(t, 503, r.StatusCode())
	assert.Equal(t, "draining", errorCode(t, r))
	assert.NotEmpty(t, r.Header.Peek("Retry-After"))
	assert.Zero(t, s.authenticated, "no key is checked while draining")

	s.draining = false
	r = handle(e, "POST", "/v1/chat/completions")
	assert.Equal(t, 401, r.StatusCode())
	assert.Equal(t, "invalid_api_key", errorCode(t, r))
	assert.Equal(t, 1, s.authenticated)

	r = handle(e, "GET", "/health")
	assert.Equal(t, 503, r.StatusCode())
	assert.Equal(t, "draining\n", string(r.Body()))
	s.ready = true
	r = handle(e, "GET", "/health")
	assert.Equal(t, 200, r.StatusCode())
	assert.Empty(t, r.Body(), "vLLM's /health answers an empty 200")

	r = handle(e, "GET", "/v1/nothing")
	assert.Equal(t, 404, r.StatusCode())
	assert.Equal(t, "not_found", errorCode(t, r))
}
