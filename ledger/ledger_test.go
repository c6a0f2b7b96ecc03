package ledger

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeyer(t *testing.T) {
	t.Parallel()
	_, err := NewKeyer([]byte("short"))
	require.ErrorIs(t, err, ErrInvalid)
	k, err := NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	a := k.Key(KindTenant, "acme")
	assert.Equal(t, a, k.Key(KindTenant, "acme"), "deterministic")
	assert.NotEqual(t, a, k.Key(KindWorkflow, "acme"), "kind is part of the MAC")
	assert.NotEqual(t, a, k.Key(KindTenant, "acme2"))
	s := a.String()
	assert.Len(t, s, 22)
	assert.False(t, strings.ContainsAny(s, "{}=+/"), "got %q", s)
	back, err := ParseScopeKey(s)
	require.NoError(t, err)
	assert.Equal(t, a, back)
	assert.NotContains(t, s, "acme")
	id := k.IdempotentID(a, "retry-1")
	assert.Equal(t, id, k.IdempotentID(a, "retry-1"))
	assert.NotEqual(t, id, k.IdempotentID(k.Key(KindTenant, "other"), "retry-1"))
}

func validReq() ReserveRequest {
	t := ScopeKey{1}
	return ReserveRequest{
		Ref:   Ref{Tenant: t, ID: RequestID{9}},
		Owner: Owner{7},
		Scopes: []Scope{
			{Kind: KindTenant, Key: t, Limits: []Limit{{Dim: Tokens, Window: time.Hour, Max: 1000}, {Dim: Slots, Max: 4}}},
			{Kind: KindWorkflow, Key: ScopeKey{2}, Limits: []Limit{{Dim: Requests, Window: time.Minute, Max: 10}}},
		},
		Held: Amounts{Requests: 1, InputTokens: 10, OutputTokens: 20, Tokens: 30},
	}
}

func TestReserveRequestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(r *ReserveRequest)
		want   error
	}{
		{name: "valid", mutate: func(*ReserveRequest) {}},
		{name: "amount over 2^50", mutate: func(r *ReserveRequest) { r.Held[GPUMs] = MaxAmount + 1 }, want: ErrInvalid},
		{name: "negative amount", mutate: func(r *ReserveRequest) { r.Held[GPUMs] = -1 }, want: ErrInvalid},
		{name: "tokens mismatch", mutate: func(r *ReserveRequest) { r.Held[Tokens] = 31 }, want: ErrInvalid},
		{name: "zero id", mutate: func(r *ReserveRequest) { r.Ref.ID = RequestID{} }, want: ErrInvalid},
		{name: "zero owner", mutate: func(r *ReserveRequest) { r.Owner = Owner{} }, want: ErrInvalid},
		{name: "ttl over max", mutate: func(r *ReserveRequest) { r.LeaseTTL = 3 * time.Minute }, want: ErrInvalid},
		{name: "no tenant scope", mutate: func(r *ReserveRequest) { r.Scopes = r.Scopes[1:] }, want: ErrInvalid},
		{name: "tenant key mismatch", mutate: func(r *ReserveRequest) { r.Scopes[0].Key = ScopeKey{3} }, want: ErrInvalid},
		{name: "two workflows", mutate: func(r *ReserveRequest) { r.Scopes = append(r.Scopes, r.Scopes[1]) }, want: ErrInvalid},
		{name: "scope without policy", mutate: func(r *ReserveRequest) { r.Scopes[1].Limits = nil }, want: ErrPolicy},
		{name: "negative limit", mutate: func(r *ReserveRequest) { r.Scopes[0].Limits[0].Max = -1 }, want: ErrPolicy},
		{name: "limit over 2^50", mutate: func(r *ReserveRequest) { r.Scopes[0].Limits[0].Max = MaxAmount + 1 }, want: ErrPolicy},
		{name: "window zero", mutate: func(r *ReserveRequest) { r.Scopes[0].Limits[0].Window = 0 }, want: ErrPolicy},
		{name: "window fractional", mutate: func(r *ReserveRequest) { r.Scopes[0].Limits[0].Window = 1500 * time.Millisecond }, want: ErrPolicy},
		{name: "window over 31d", mutate: func(r *ReserveRequest) { r.Scopes[0].Limits[0].Window = MaxWindow + time.Second }, want: ErrPolicy},
		{name: "window on slots", mutate: func(r *ReserveRequest) { r.Scopes[0].Limits[1].Window = time.Second }, want: ErrPolicy},
		{name: "duplicate limit", mutate: func(r *ReserveRequest) { r.Scopes[1].Limits = append(r.Scopes[1].Limits, r.Scopes[1].Limits[0]) }, want: ErrPolicy},
		{name: "global scope", mutate: func(r *ReserveRequest) {
			r.Scopes = append(r.Scopes, Scope{Kind: KindGlobal, Key: ScopeKey{5}, Limits: []Limit{{Dim: Slots, Max: 1}}})
		}, want: ErrPolicy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := validReq()
			tc.mutate(&r)
			err := r.Validate(2 * time.Minute)
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, tc.want)
		})
	}
}

func TestDigest(t *testing.T) {
	t.Parallel()
	a, b := validReq(), validReq()
	b.Scopes[0], b.Scopes[1] = b.Scopes[1], b.Scopes[0]
	b.LeaseTTL, b.Dispatch, b.Owner = time.Minute, true, Owner{8}
	assert.Equal(t, a.Digest(), b.Digest(), "order, ttl, owner and dispatch are not part of the payload")
	b.Held[OutputTokens]++
	b.Held[Tokens]++
	assert.NotEqual(t, a.Digest(), b.Digest())
	c := validReq()
	c.Scopes[1].Key = ScopeKey{3}
	assert.NotEqual(t, a.Digest(), c.Digest())
}

func TestDeniedError(t *testing.T) {
	t.Parallel()
	e := &DeniedError{Scope: KindWorkflow, Dim: Tokens, Window: time.Hour, Limit: 500000, Committed: 480000,
		Reserved: 15000, Requested: 8000, ResetsAt: time.Date(2026, 11, 25, 14, 0, 0, 0, time.UTC), RetryAfter: 90 * time.Second}
	var err error = e
	require.ErrorIs(t, err, ErrDenied)
	require.NotErrorIs(t, err, ErrPolicy)
	assert.Equal(t, "ledger: workflow budget exceeded: tokens per 1h: committed 480000 + reserved 15000 + requested 8000 > limit 500000; resets at 2026-11-25T14:00:00Z (retry after 1m30s)", e.Error())
	b, err := json.Marshal(e.Details())
	require.NoError(t, err)
	assert.JSONEq(t, `{"scope":"workflow","dimension":"tokens","window":"1h","limit":500000,"committed":480000,"reserved":15000,"requested":8000,"resets_at":"2026-11-25T14:00:00Z"}`, string(b))
	assert.Equal(t, int64(90000), e.RetryAfterMillis())
	e.RetryAfter = 1500*time.Microsecond + 1
	assert.Equal(t, int64(2), e.RetryAfterMillis())
	s := &DeniedError{Scope: KindTenant, Dim: Slots, Limit: 5, Reserved: 5, Requested: 1}
	assert.Equal(t, "ledger: tenant concurrency limit reached: 5 of 5 slots in use", s.Error())
}

func TestWindows(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		w    time.Duration
		want string
	}{
		{"slots", 0, "0"}, {"hour", time.Hour, "1h"}, {"day", 24 * time.Hour, "24h"}, {"minutes", 30 * time.Minute, "30m"}, {"seconds", 90 * time.Second, "90s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, FormatWindow(tc.w))
		})
	}
	now := time.Date(2026, 11, 25, 13, 59, 59, 900e6, time.UTC)
	idx := WindowIndex(now, time.Hour)
	assert.Equal(t, time.Date(2026, 11, 25, 14, 0, 0, 0, time.UTC), WindowResetsAt(idx, time.Hour))
	assert.Equal(t, time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), WindowResetsAt(WindowIndex(now, 24*time.Hour), 24*time.Hour))
	assert.Equal(t, int64(-1), floorDiv(-1, 1000))
}

func TestDimNames(t *testing.T) {
	t.Parallel()
	for d := Dim(0); d < NumDims; d++ {
		p, err := ParseDim(d.String())
		require.NoError(t, err)
		assert.Equal(t, d, p)
	}
	_, err := ParseDim("bogus")
	assert.ErrorIs(t, err, ErrPolicy)
}

// TestGPUJoulesDimension: gpu_joules is a windowed dimension with a stable
// number after slots, and digests of requests without it are unchanged
// (0x8764e78a761ab629 is what 6099134, before the dimension, computed).
func TestGPUJoulesDimension(t *testing.T) {
	t.Parallel()
	d, err := ParseDim("gpu_joules")
	require.NoError(t, err)
	assert.Equal(t, GPUJoules, d)
	assert.Equal(t, "gpu_joules", GPUJoules.String())
	assert.EqualValues(t, 7, GPUJoules, "dimension numbers are stored: appended, never renumbered")
	assert.True(t, GPUJoules.Windowed())
	assert.False(t, Slots.Windowed())
	require.NoError(t, Limit{Dim: GPUJoules, Window: time.Hour, Max: 1 << 40}.Validate())
	require.ErrorIs(t, Limit{Dim: GPUJoules, Max: 1}.Validate(), ErrPolicy, "windowed: needs a window")

	r := ReserveRequest{Ref: Ref{Tenant: ScopeKey{1}, ID: RequestID{2}},
		Scopes: []Scope{{Kind: KindTenant, Key: ScopeKey{1}}, {Kind: KindAPIKey, Key: ScopeKey{3}}},
		Held:   Amounts{1, 10, 20, 30, 400, 5, 0}}
	assert.Equal(t, uint64(0x8764e78a761ab629), r.Digest(), "digest without gpu_joules is the old one")
	j := r
	j.Held[GPUJoules] = 12
	assert.NotEqual(t, r.Digest(), j.Digest())
	j.Held[Slots] = 1
	j2 := j
	j2.Held[Slots] = 0
	assert.Equal(t, j.Digest(), j2.Digest(), "slots are not part of the digest")
}
