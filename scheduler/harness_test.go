package scheduler

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// newTestServer builds a Server on the fakes (lifecycletest) with a
// fixed-size replica r0; opts set further Deps.
func newTestServer(t testing.TB, cfg *config.File, led Ledger, up lifecycle.Upstream, opts ...func(*Deps)) *Server {
	t.Helper()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, Replicas: []gpu.Replica{{Name: "r0", CapacityTokens: 1 << 20}}}, gpu.Deps{})
	require.NoError(t, err)
	deps := Deps{Ledger: led, Upstream: up, Keyer: keyer, GPU: mon}
	for _, o := range opts {
		o(&deps)
	}
	s, err := New(cfg, deps)
	require.NoError(t, err)
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1 << 20})
	for _, r := range s.reps.List() {
		r.MaxSeqs = 1 << 20
	}
	return s
}

// serve runs one chat request of tenant acme (key sk-acme) through the
// lifecycle's ports, as the edge does, and returns its body or the error
// that ended it.
func serve(ctx context.Context, s *Server, a lifecycle.Admission) ([]byte, error) {
	c, err := s.Authenticate([]byte("Bearer sk-acme"))
	if err != nil {
		return nil, err
	}
	a.Caller = c
	if a.Endpoint == 0 {
		a.Endpoint = vllm.EndpointChat
	}
	if a.RequestID == "" {
		a.RequestID = "req"
	}
	tk, err := s.Start(ctx, a)
	if tk == nil {
		return nil, err
	}
	var out wholeSink
	tk.Finish(&out)
	return out.body, out.err
}

// acme is tenant acme's caller (key sk-acme).
func acme(t testing.TB, s *Server) lifecycle.Caller {
	t.Helper()
	c, err := s.Authenticate([]byte("Bearer sk-acme"))
	require.NoError(t, err)
	return c
}

// wholeSink keeps a non-streamed answer or the error Finish answered.
type wholeSink struct {
	body []byte
	err  error
}

func (w *wholeSink) Whole(_ lifecycle.Meta, body []byte)                 { w.body = body }
func (w *wholeSink) Refuse(err error, _ *apierr.Error, _ lifecycle.Meta) { w.err = err }
func (w *wholeSink) Stream() (io.Writer, lifecycle.WriteDeadliner)       { return io.Discard, nil }

// tenantUsage reads acme's tenant scope from the Memory.
func tenantUsage(t testing.TB, s *Server, m *ledger.Memory) ledger.Usage {
	t.Helper()
	return lifecycletest.Usage(t, m, s.pol.Load().Tenants["acme"].ScopeKey)
}

var _ ReservationLister = (*ledger.Memory)(nil)
