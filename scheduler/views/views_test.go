package views

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/policy"
)

var t0 = time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)

// TestBudgetRowsArePolicyLimits: the rows are the limits in force (not
// slots, not the resolution window), with the policy's limit and mode and
// the ledger's use; a window the ledger has not seen shows zero use.
func TestBudgetRowsArePolicyLimits(t *testing.T) {
	tokens := ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000, Mode: ledger.Warn}
	requests := ledger.Limit{Dim: ledger.Requests, Window: 24 * time.Hour, Max: 50}
	limits := []ledger.Limit{tokens, requests, {Dim: ledger.Slots, Max: 4}, policy.ResolutionLimit}
	stale := tokens
	stale.Max, stale.Mode = 10, ledger.Block // the ledger's copy of the last request's
	u := ledger.Usage{Limits: []ledger.LimitUsage{{Limit: stale, Committed: 700, Reserved: 200, ResetsAt: t0.Add(time.Hour).In(time.FixedZone("x", 3600))}}}
	assert.Equal(t, []UsageRow{
		{Dimension: "tokens", Window: "1h", Limit: 1000, Mode: "warn", Committed: 700, Reserved: 200, Remaining: 100, ResetsAt: "2026-03-04T11:00:00Z"},
		{Dimension: "requests", Window: "24h", Limit: 50, Mode: "block", Remaining: 50},
	}, BudgetRows(limits, u))
	assert.Equal(t, []UsageRow{}, BudgetRows(limits[2:], u), "no budget: an empty list, not null")

	iu, ok := BudgetInUse("tokens", "1h0m0s", 800, u)
	require.True(t, ok)
	assert.Equal(t, InUse{Committed: 700, Reserved: 200, Remaining: 0, ResetsAt: "2026-03-04T11:00:00Z"}, iu, "over the limit: none remains")
	iu, ok = BudgetInUse("requests", "24h0m0s", 50, u)
	require.True(t, ok)
	assert.Equal(t, InUse{Remaining: 50}, iu)
	_, ok = BudgetInUse("tokens", "hourly", 800, u)
	assert.False(t, ok)
}

// TestReplicaRows: GET /admin/replicas shows the batch account; the
// status page's rows show the monitor's and the scrape's columns, sorted
// by name, with the state's age from the sampler.
func TestReplicaRows(t *testing.T) {
	in := []ReplicaIn{
		{Name: "r2", URL: "http://user:secret@r2:8000", Inflight: 3, AbortsHeld: true, Peers: 2, SeqShare: 40, SeqBound: []string{"flood", "loop"}, SeqCut: []string{"loop"}, MaxNumSeqs: 256, LearnedBatch: 80, BatchLimit: 72, Seqs: 75,
			GPU: gpu.ReplicaView{State: gpu.StateHealthy, CapacityTokens: 9000, Sizing: "kv", GPUCount: 2}, Known: true,
			Obs: &fleet.Obs{Running: 5, Waiting: 7, Deferred: 1, LoRAs: []string{"l1"}}},
		{Name: "r1", URL: "http://r1:8000"},
	}
	got := ReplicaStatuses(in)
	require.Len(t, got, 2)
	assert.Equal(t, ReplicaStatus{Name: "r2", URL: "http://r2:8000", State: "healthy", CapacityTokens: 9000, Inflight: 3, Running: 5, Waiting: 7,
		AbortsHeld: true, Peers: 2, SeqShare: 40, SeqShareBinds: []string{"flood", "loop"}, SeqShareCut: []string{"loop"}, Sizing: "kv", WaitingDeferred: 1, LoRAResident: []string{"l1"}, MaxNumSeqs: 256, LearnedBatch: 80, BatchLimit: 72, Seqs: 75}, got[0])
	assert.Equal(t, "unknown", got[1].State, "not yet seen by the monitor")
	b, err := json.Marshal(ReplicaStatuses(nil))
	require.NoError(t, err)
	assert.Equal(t, "[]", string(b))

	var o OpsSampler
	o.Record(OpsSample{At: t0, Replicas: map[string]string{"r1": "unknown", "r2": "healthy"}}, t0.Add(-time.Second))
	o.Record(OpsSample{At: t0.Add(time.Second), Replicas: map[string]string{"r1": "unhealthy", "r2": "healthy"}}, t0.Add(-time.Second))
	st := Status(StatusIn{At: t0.Add(11 * time.Second), Replicas: in, Ops: o.Snapshot()})
	require.Len(t, st.Replicas, 2)
	r1, r2 := st.Replicas[0], st.Replicas[1]
	assert.Equal(t, "r1", r1.Name)
	assert.Equal(t, int64(10), r1.StateForS, "r1 changed state a second after t0")
	assert.Equal(t, int64(12), r2.StateForS, "r2's first state dates from the start")
	assert.Equal(t, 2, r2.GPUCount)
	assert.Equal(t, "http://r2:8000", r2.URL)
	assert.Equal(t, got[0], r2.ReplicaStatus, "the page's rows are the admin API's, batch account included")
}

// TestStatusKeysAndErrors: the config's keys first in their order, then
// the run-time ones by tenant and label; what could not be read is named,
// on one line, and its rows still show the limits.
func TestStatusKeysAndErrors(t *testing.T) {
	lim := []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 10}}
	down := errors.New("ledger down\nretrying")
	st := Status(StatusIn{At: t0,
		Tenants: []TenantIn{{Name: "acme", Limits: lim, Use: LedgerUse{Err: down}, MaxWait: 30 * time.Second}, {Name: "beta"}},
		Keys: []KeyIn{
			{Tenant: "beta", Label: "zz", Runtime: true, Limits: lim},
			{Tenant: "beta", Label: "cfg2", Limits: lim},
			{Tenant: "acme", Label: "rt", Runtime: true, Limits: lim, ExpiresAt: t0.Add(time.Hour), Use: LedgerUse{Err: down}},
			{Tenant: "acme", Label: "cfg1", Slots: 2, Limits: lim},
		}})
	var order []string
	for _, k := range st.Keys {
		order = append(order, k.Source+":"+k.Tenant+"/"+k.Label)
	}
	assert.Equal(t, []string{"config:beta/cfg2", "config:acme/cfg1", "admin:acme/rt", "admin:beta/zz"}, order)
	assert.Equal(t, map[string]string{"budgets acme": "ledger down; retrying", "key budgets acme/rt": "ledger down; retrying"}, st.Errors)
	assert.Equal(t, int64(10), st.Tenants[0].Budgets[0].Remaining)
	assert.Equal(t, "30s", st.Tenants[0].MaxWait)
	assert.Equal(t, []UsageRow{}, st.Tenants[1].Budgets)
	require.NotNil(t, st.Keys[2].ExpiresAt)
	assert.Equal(t, []Refusal{}, st.Refusals)
}

// TestUsageReport: rows filtered and sorted, the dimension asked only,
// and with a window the report starts at the first whole hour counted.
func TestUsageReport(t *testing.T) {
	now := t0.Add(25 * time.Minute)
	in := UsageIn{Now: now, Started: t0.Add(-time.Minute), Dims: []string{"requests", "output_tokens"}, Counts: []UsageCount{
		{Tenant: "beta", Key: "k", Model: "m", Values: []int64{1, 10}},
		{Tenant: "acme", Key: "k2", Model: "m", Values: []int64{2, 20}},
		{Tenant: "acme", Key: "k1", Model: "m", Values: []int64{3, 30}},
	}}
	r := Usage(in, UsageFilter{Tenant: "acme", Dimension: "requests"})
	assert.Equal(t, t0.Add(-time.Minute), r.Since)
	assert.Empty(t, r.Window)
	assert.Equal(t, []UsageTotalRow{
		{Tenant: "acme", Key: "k1", Model: "m", Usage: map[string]int64{"requests": 3}},
		{Tenant: "acme", Key: "k2", Model: "m", Usage: map[string]int64{"requests": 2}},
	}, r.Rows)

	in.Window = 90 * time.Minute
	assert.Equal(t, now.Unix()/3600-1, FirstHour(now, in.Window), "90m: this hour and the one before")
	r = Usage(in, UsageFilter{})
	assert.Equal(t, t0.Add(-time.Hour), r.Since)
	assert.Equal(t, "1h30m0s", r.Window)
	assert.Len(t, r.Rows, 3)
}

// TestOpsSamplerRatesAndPeaks: rates over the last 10 s of samples from
// the usage counters summed per tenant; peaks are the highest sampled;
// a minute of samples is kept.
func TestOpsSamplerRatesAndPeaks(t *testing.T) {
	var o OpsSampler
	dims := []string{"requests", "input_tokens", "output_tokens", "gpu_ms"}
	for i := range 70 {
		n := int64(i)
		o.Record(OpsSample{At: t0.Add(time.Duration(i) * time.Second),
			Usage: UsageIn{Dims: dims, Counts: []UsageCount{
				{Tenant: "acme", Key: "a", Values: []int64{2 * n, 10 * n, 5 * n, 999}},
				{Tenant: "acme", Key: "b", Values: []int64{n, 0, 0, 999}},
				{Tenant: "gone", Values: []int64{100, 100, 100, 100}},
			}},
			Tenants: map[string]TenantSample{"acme": {Queued: n % 7, Inflight: 3}}}, t0)
	}
	ops := o.Snapshot()
	acme := ops.Tenant("acme")
	assert.Equal(t, 3.0, acme.ReqPerSec)
	assert.Equal(t, 15.0, acme.TokPerSec, "input + output tokens")
	assert.Equal(t, int64(6), acme.PeakQueued)
	assert.Equal(t, int64(3), acme.PeakFlight)
	assert.Nil(t, acme.TTFTP50ms, "no TTFT observed: no percentile")
	assert.Len(t, ops.samples, opsSamples, "a minute of samples kept")
	assert.Equal(t, TenantOps{}, ops.Tenant("gone"), "not a sampled tenant")
}
