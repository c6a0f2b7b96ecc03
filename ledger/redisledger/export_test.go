package redisledger

import "context"

// SetTimeFloor pins ledger time for tests: every script uses
// max(TIME, hwm, f()) as now. Call it before the Ledger is shared.
func SetTimeFloor(l *Ledger, f func() int64) { l.floor = f }

// UseBatchScript makes a batching Ledger run its batches with the batch
// script (EVALSHA) instead of the function library, as on a server without
// functions.
func UseBatchScript(l *Ledger) { l.b.noFunc.Store(true) }

// RecordFormat is the struct.pack format of a packed record.
const RecordFormat = recordFormat

// ReclaimAll runs one tick of Run: every partition scanned and reclaimed.
func ReclaimAll(ctx context.Context, l *Ledger) { l.reclaimAll(ctx) }

// SetScanBatch sets how many partitions one idle scan call of Run carries
// (1: each partition alone, as on a server without functions).
func SetScanBatch(l *Ledger, n int) { l.scanBatch = n }
