package redisledger

// SetTimeFloor pins ledger time for tests: every script uses
// max(TIME, hwm, f()) as now. Call it before the Ledger is shared.
func SetTimeFloor(l *Ledger, f func() int64) { l.floor = f }
