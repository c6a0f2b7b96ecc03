package settle

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// owedCharge is an outage charge of acme's, as the scheduler's outage
// admission builds it.
func owedCharge(amounts ledger.Amounts, running bool) *OwedCharge {
	return &OwedCharge{Tenant: "acme", ReqID: "owed", Running: running, Source: ledger.SourceFinal,
		Req: ledger.ChargeRequest{Ref: ledger.Ref{Tenant: acme, ID: ledger.NewRequestID()},
			Scopes: acmeScopes, Amounts: amounts, At: time.Now()}}
}

// TestPendingLogMigratesOlderFiles: a process of an older version left a
// pending ending in outbox.jsonl and an owed charge in outage.json. The
// first start moves both into the pending-writes log and removes the old
// files; a crash before anything is retried reads them from the log
// again; each lands exactly once.
func TestPendingLogMigratesOlderFiles(t *testing.T) {
	p := testPaths(t)
	led := newHookLedger(t)
	ctx := context.Background()

	// An ending the store refused, as the older version would have kept it.
	s1 := newRoom(t, led, p, false)
	ref := reserve(t, led, s1.owner)
	led.set(func() { led.settle = func(ledger.Ref) error { return ledger.ErrUnavailable } })
	settleCall(t, s1, ref, used)
	led.set(func() { led.settle = nil })
	require.Equal(t, 1, s1.Pending())
	endings, err := os.ReadFile(p.Pending)
	require.NoError(t, err)
	require.Equal(t, 1, lines(t, p.Pending))
	require.NoError(t, os.WriteFile(p.LegacyOutbox, endings, 0o600))
	require.NoError(t, os.Remove(p.Pending))
	// A charge still running when the older process stopped: billed at
	// its hold.
	ch := owedCharge(ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 100, ledger.Tokens: 100}, true)
	doc, err := json.Marshal([]*OwedCharge{ch})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p.LegacyOutage, doc, 0o600))

	s2 := newRoom(t, led, p, false)
	assert.NoFileExists(t, p.LegacyOutbox, "moved in, then removed")
	assert.NoFileExists(t, p.LegacyOutage)
	assert.Equal(t, 2, lines(t, p.Pending), "the ending and the charge, one line each")
	assert.Equal(t, 1, s2.Pending())
	require.Len(t, s2.Chargeable(), 1, "the running charge is chargeable at its hold")
	assert.Equal(t, ledger.SourceHeld, s2.Chargeable()[0].Source)

	// Killed before a pass: the next start reads the log alone.
	s3 := newRoom(t, led, p, false)
	assert.Equal(t, 1, s3.Pending())
	assert.Len(t, s3.Chargeable(), 1)
	s3.Pass(ctx)
	assert.Zero(t, s3.Unacked())
	assert.Zero(t, s3.Owed())
	assert.Zero(t, lines(t, p.Pending), "nothing pending or owed: emptied")

	s4 := newRoom(t, led, p, false)
	assert.Zero(t, s4.Unacked())
	assert.Zero(t, s4.Owed())
	u := acmeUsage(t, led.Memory)
	assert.Equal(t, int64(2), committed(u, ledger.Requests), "the settled call and the charged one, once each")
	assert.Equal(t, int64(5+3+100), committed(u, ledger.Tokens))
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestPendingLogOwedCharges: an owed charge's last line wins across a
// restart (its usage, once known, not its hold), and a charge no longer
// owed (refunded: the call never ran) is not billed by the next process.
func TestPendingLogOwedCharges(t *testing.T) {
	p := testPaths(t)
	led := newHookLedger(t)
	s1 := newRoom(t, led, p, false)
	hold := ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 500, ledger.Tokens: 500}
	first := owedCharge(hold, true)
	require.NoError(t, s1.outage.put(first))
	settled := *first
	settled.Running, settled.Req.Amounts = false, ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 40, ledger.OutputTokens: 2, ledger.Tokens: 42}
	s1.OweOutage(&settled)
	refunded := owedCharge(hold, true)
	require.NoError(t, s1.outage.put(refunded))
	s1.OutageNotRun("acme", 500, refunded.Req.Ref, refunded.ReqID)
	assert.Equal(t, 4, lines(t, p.Pending), "two lines of one charge, one of another and that it is no longer owed")

	s2 := newRoom(t, led, p, false)
	owed := s2.Chargeable()
	require.Len(t, owed, 1, "the refunded charge is not owed")
	assert.Equal(t, first.Req.Ref.ID, owed[0].Req.Ref.ID)
	assert.Equal(t, int64(42), owed[0].Req.Amounts[ledger.Tokens], "the usage, not the hold")
	s2.Pass(context.Background())
	assert.Zero(t, lines(t, p.Pending))
	u := acmeUsage(t, led.Memory)
	assert.Equal(t, int64(1), committed(u, ledger.Requests))
	assert.Equal(t, int64(42), committed(u, ledger.Tokens))
	assert.Equal(t, 1, led.n("charge"))
}

// TestOutageAllowance: the allowance bounds requests and tokens per outage
// and per clock hour; a refund gives a request back; the ledger's answer
// ends the outage, and the next one starts with a full allowance (the
// hour's count goes on).
func TestOutageAllowance(t *testing.T) {
	led := newHookLedger(t)
	s := newRoom(t, led, testPaths(t), false)
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	al := config.OutageAllowance{Requests: 2, Tokens: 300}
	admit := func(tokens int64) bool {
		_, ok := s.AdmitOutage(al, tokens, owedCharge(ledger.Amounts{ledger.Tokens: tokens}, true))
		return ok
	}
	require.True(t, admit(100))
	require.False(t, admit(250), "tokens: 100+250 > 300")
	require.True(t, admit(200))
	require.False(t, admit(1), "requests: 2 per outage")
	assert.Equal(t, 2, s.Owed())

	s.outage.refund("acme", 200)
	require.True(t, admit(200), "a refunded request's room is free again")

	assert.True(t, s.LedgerAnswered(), "an outage was in progress")
	assert.False(t, s.LedgerAnswered())
	require.False(t, admit(100), "a new outage, but this hour has used its allowance")
	now = now.Add(time.Hour)
	require.True(t, admit(100), "the next hour: room again")
}

// TestPendingLogRewrittenWhenChargeDropped: a charge no longer owed leaves
// its lines in the log until the next pass rewrites it, even when that
// pass ends nothing and the log is far below compactAt: the dropped
// charge's record (the tenant's usage and request id) does not stay on
// disk beside a charge still owed.
func TestPendingLogRewrittenWhenChargeDropped(t *testing.T) {
	p := testPaths(t)
	led := newHookLedger(t)
	s := newRoom(t, led, p, false)
	hold := ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 500, ledger.Tokens: 500}
	kept := owedCharge(hold, true)
	kept.ReqID = "kept-call"
	require.NoError(t, s.outage.put(kept))
	refunded := owedCharge(hold, true)
	refunded.ReqID = "refunded-call"
	require.NoError(t, s.outage.put(refunded))
	s.OutageNotRun("acme", 500, refunded.Req.Ref, refunded.ReqID)
	require.Equal(t, 3, lines(t, p.Pending), "two charges and that one is no longer owed")

	s.Flush(context.Background()) // nothing pending: a pass that ends nothing
	assert.Equal(t, 1, lines(t, p.Pending), "rewritten with the charge still owed only")
	b, err := os.ReadFile(p.Pending)
	require.NoError(t, err)
	assert.NotContains(t, string(b), refunded.ReqID, "the dropped charge's lines are gone")
	assert.Contains(t, string(b), kept.ReqID)

	s2 := newRoom(t, led, p, false)
	owed := s2.Chargeable()
	require.Len(t, owed, 1)
	assert.Equal(t, kept.Req.Ref.ID, owed[0].Req.Ref.ID)
}
