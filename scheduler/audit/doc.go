// Package audit is Sluice's tamper-evident audit trail: every admission
// decision, settlement, resolve, clamp and admin change is appended to a
// file as one JSON line that carries the SHA-256 of the line before it.
//
// # Line format
//
// Each line is canonical JSON (fixed key order, no insignificant spaces,
// a trailing '\n'):
//
//	{"seq":7,"ts":"2026-11-29T19:20:48.123456789Z","prev":"<64 hex>","kind":"admit","tenant":"acme",...}
//
// The members are:
//
//   - seq is 1 for the first line of a chain and exactly +1 per line after
//     it, across rotated files.
//   - ts is the append time, RFC 3339 with nine fractional digits, UTC.
//   - prev is the hex SHA-256 of the previous line's bytes without its
//     newline; the first line of a chain has 64 zeros.
//   - then the [Record] fields; empty strings and zero numbers are omitted
//     (a missing number reads as 0), and Fields, if any, come last as
//     "fields" with sorted keys.
//
// # Invariants
//
//  1. Lines are written whole, in seq order, by one [Log] per chain. On
//     Unix, Open takes an exclusive flock on <path>.lock, so a second Log
//     on the same path (another process, or a reload that forgot to Close)
//     fails with [ErrLocked] instead of interleaving two chains.
//  2. A chain never restarts silently: [Open] resumes from the last line of
//     the current file (or of the newest rotated file when the current one
//     is empty or missing) and refuses to open when that tail is torn or
//     corrupt, naming the file and line.
//  3. No raw API key is ever written. [Record] has no field for one;
//     callers pass tenant names and Sluice request ids only, and [Log.Append]
//     rejects Fields keys that look like credentials.
//
// # Rotation
//
// When a line would take the current file past Config.MaxBytes, the file is
// renamed to <path>.<n> (n = 1, 2, 3, … ; always one more than the highest
// existing suffix) and a fresh <path> is created. The first line of the
// new file carries the hash of the last line of the renamed one and seq
// continues, so the rotated files plus the current one form one chain.
// [Verify] given just <path> discovers the rotated siblings and checks them
// in numeric order followed by <path>.
//
// # Durability
//
// Append only encodes into a memory buffer; the buffer is written to the
// file at least every Config.FlushInterval (by [Log.Run]), whenever it
// exceeds 64 KiB, before a rotation and on [Log.Close]. A process or
// machine crash can therefore lose at most the lines appended during the
// last flush interval. With Config.Sync each write is followed by fsync,
// so a machine crash loses no more than a process crash; the price is that
// an Append which triggers a write waits for the disk. A write or fsync
// error is sticky: every later Append and Run returns it, because after a
// partial write the file's tail is unknown.
//
// A crash in the middle of a write can leave a torn last line; Open then
// refuses to start rather than chain onto it. The operator inspects the
// file (sluice audit verify names the line), truncates the torn line, and
// restarts; the chain then continues from the last whole line.
//
// # What verification can and cannot show
//
// [Verify] detects any changed, inserted, deleted or reordered line, a
// missing middle file, and a torn or malformed line, and names the first
// broken line. A hash chain cannot show that whole lines were cut from the
// end of the newest file (or that the newest files were removed): the
// remaining prefix is a valid chain. [Report] carries the last seq and
// hash so that an operator can record the head elsewhere and compare.
//
// # Design rationale
//
// The line is encoded by hand rather than with encoding/json so that Append
// allocates nothing for a typical record and the bytes are canonical by
// construction. The record part is encoded outside the lock; only seq, ts,
// prev and the hash are done under it, since they depend on the previous
// line.
package audit
