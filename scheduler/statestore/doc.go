// Package statestore keeps small named documents that every Sluice instance
// of a fleet shares: the API keys created at run time, the admin state. Each
// document has a revision that grows by one with every write; writers
// compare-and-set on it, so two instances updating the same document at
// once never lose an update, and readers poll the revision to see changes.
//
// Three backends implement [Store]:
//
//   - [File] keeps each document in <dir>/<name>.json, written to a
//     temporary file, fsynced and renamed into place (then the directory is
//     fsynced), under an flock on <dir>/<name>.lock so that processes
//     sharing the directory serialise their writes. It is the store of the
//     embedded-ledger layout and lives next to the journal.
//   - [Memory] keeps documents in process, for a server without a journal.
//   - [Redis] keeps each document in one hash (fields rev and data) and
//     compare-and-sets it with a one-key Lua script, so it is safe on Redis
//     Cluster (a document is one key, hence one slot). It is the store of
//     the Redis-ledger layout: every instance sees a write at its next poll.
//
// Every document also has an epoch, a random id given when it is created
// and kept by every later write, so that a reader can tell a backend that
// went back (a failover that lost writes, a restart without persistence)
// from one that moved on: see [Doc.After].
//
// # Design rationale
//
// Documents are small (kilobytes) and change rarely (an operator creates a
// key), while every instance must see a change within a second. Polling
// the revision is one cheap round trip per document per interval and needs
// no pub/sub connection that can silently drop messages; a missed poll is
// repaired by the next one. Whole-document compare-and-set keeps the
// semantics obvious: an update is a pure function of the previous bytes,
// retried on conflict.
package statestore
