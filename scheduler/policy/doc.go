// Package policy owns what admission is allowed to do, as values: the
// snapshot of tenants, API keys, prices and budgets built from the config
// file plus the admin state (budget overrides and clamps), the run-time
// keys followed from the shared keys document, the admin state followed
// from and written to the shared admin document (SharedAdmin), and the
// formats of the admin state file, the shared admin document and the keys
// document.
//
// It knows nothing of requests or of the server: the scheduler builds a
// Snapshot on every reload or admin change, swaps it in whole, and reads
// it at admission and dispatch. Imports point one way: scheduler imports
// policy; policy imports only the leaves (ledger, scheduler/config,
// scheduler/statestore).
package policy
