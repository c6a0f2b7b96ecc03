package redisledger

// SetTimeFloor pins ledger time for tests: every script uses
// max(TIME, hwm, f()) as now. Call it before the Ledger is shared.
func SetTimeFloor(l *Ledger, f func() int64) { l.floor = f }

// UseBatchScript makes a batching Ledger run its batches with the batch
// script (EVALSHA) instead of the function library, as on a server without
// functions.
func UseBatchScript(l *Ledger) { l.b.noFunc.Store(true) }

// RecordFormat is the struct.pack format of a packed record.
const RecordFormat = recordFormat
