package scheduler

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// owedCharge is an outage charge of acme's, as admitOutage builds it.
func owedCharge(s *Server, amounts ledger.Amounts, running bool) *outageCharge {
	t := s.pol.Load().Tenants["acme"]
	return &outageCharge{Tenant: "acme", ReqID: "owed", Running: running, Source: ledger.SourceFinal,
		Req: ledger.ChargeRequest{Ref: ledger.Ref{Tenant: t.ScopeKey, ID: ledger.NewRequestID()},
			Scopes:  []ledger.Scope{{Kind: ledger.KindTenant, Key: t.ScopeKey, Limits: t.Limits}},
			Amounts: amounts, At: s.now()}}
}

// TestPendingLogMigratesOlderFiles: a process of an older version left a
// pending ending in outbox.jsonl and an owed charge in outage.json. The
// first start moves both into the pending-writes log and removes the old
// files; a crash before anything is retried reads them from the log
// again; each lands exactly once.
func TestPendingLogMigratesOlderFiles(t *testing.T) {
	cfg, path := outboxTestConfig(t)
	p := cfg.Paths()
	require.Equal(t, path, p.Pending)
	led := newFakeLedger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// An ending the store refused, as the older version would have kept it.
	s1 := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	go s1.dispatchLoop(ctx)
	led.set(func() {
		led.settle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
	})
	_, err := serve(ctx, s1, admission{body: chatBody("")})
	require.NoError(t, err)
	led.set(func() { led.settle = nil })
	require.Equal(t, 1, s1.outbox.len())
	endings, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, 1, lines(t, path))
	require.NoError(t, os.WriteFile(p.LegacyOutbox, endings, 0o600))
	require.NoError(t, os.Remove(path))
	// A charge still running when the older process stopped: billed at
	// its hold.
	ch := owedCharge(s1, ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 100, ledger.Tokens: 100}, true)
	doc, err := json.Marshal([]*outageCharge{ch})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p.LegacyOutage, doc, 0o600))
	cancel()

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	s2 := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	assert.NoFileExists(t, p.LegacyOutbox, "moved in, then removed")
	assert.NoFileExists(t, p.LegacyOutage)
	assert.Equal(t, 2, lines(t, path), "the ending and the charge, one line each")
	assert.Equal(t, 1, s2.outbox.len())
	require.Len(t, s2.outage.chargeable(), 1, "the running charge is chargeable at its hold")
	assert.Equal(t, ledger.SourceHeld, s2.outage.chargeable()[0].Source)

	// Killed before a pass: the next start reads the log alone.
	s3 := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	assert.Equal(t, 1, s3.outbox.len())
	assert.Len(t, s3.outage.chargeable(), 1)
	s3.chargeOutages(ctx)
	s3.flushOutbox(ctx)
	assert.Zero(t, s3.outbox.count())
	assert.Zero(t, s3.outage.count())
	assert.Zero(t, lines(t, path), "nothing pending or owed: emptied")

	s4 := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	assert.Zero(t, s4.outbox.count())
	assert.Zero(t, s4.outage.count())
	u := tenantUsage(t, s4, led.Memory)
	assert.Equal(t, int64(2), committed(u, ledger.Requests, time.Hour), "the settled call and the charged one, once each")
	assert.Equal(t, int64(5+3+100), committed(u, ledger.Tokens, time.Hour))
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestPendingLogOwedCharges: an owed charge's last line wins across a
// restart (its usage, once known, not its hold), and a charge no longer
// owed (refunded: the call never ran) is not billed by the next process.
func TestPendingLogOwedCharges(t *testing.T) {
	cfg, path := outboxTestConfig(t)
	led := newFakeLedger(t)
	s1 := newTestServer(t, cfg, led, &fakeUpstream{})
	used := owedCharge(s1, ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 500, ledger.Tokens: 500}, true)
	require.NoError(t, s1.outage.put(used))
	settled := *used
	settled.Running, settled.Req.Amounts = false, ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 40, ledger.OutputTokens: 2, ledger.Tokens: 42}
	require.NoError(t, s1.outage.put(&settled))
	refunded := owedCharge(s1, ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 500, ledger.Tokens: 500}, true)
	require.NoError(t, s1.outage.put(refunded))
	require.NoError(t, s1.outage.drop(refunded.Req.Ref.ID))
	assert.Equal(t, 4, lines(t, path), "two lines of one charge, one of another and that it is no longer owed")

	s2 := newTestServer(t, cfg, led, &fakeUpstream{})
	owed := s2.outage.chargeable()
	require.Len(t, owed, 1, "the refunded charge is not owed")
	assert.Equal(t, used.Req.Ref.ID, owed[0].Req.Ref.ID)
	assert.Equal(t, int64(42), owed[0].Req.Amounts[ledger.Tokens], "the usage, not the hold")
	ctx := context.Background()
	s2.chargeOutages(ctx)
	s2.flushOutbox(ctx)
	assert.Zero(t, lines(t, path))
	u := tenantUsage(t, s2, led.Memory)
	assert.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour))
	assert.Equal(t, int64(42), committed(u, ledger.Tokens, time.Hour))
}
