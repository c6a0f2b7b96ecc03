// Package scheduler is Sluice's admission pipeline as a composition root:
// it builds the call lifecycle (package scheduler/lifecycle, whose exported
// methods [Server] carries for the client edge) on the policy, the fleet,
// the settlement room and the admin state, keeps the replicas and the
// admin state current, and supervises every background loop of the
// process. The admin API (package scheduler/adminapi) calls its
// value-returning operations. How one request is admitted, dispatched and
// settled is the lifecycle's package documentation.
//
// # Who owns what
//
//   - The heartbeat (settle/lease.go) owns the leases: each tracked call's
//     last acknowledged grant and its fence timer, under the room's lock.
//     It extends every lease from Reserve to the terminal transition
//     (queued calls too), in parallel with bounded concurrency, and a
//     call's fence fires
//     from the send time of its last acknowledged grant, lease_ttl −
//     min(2s, lease_ttl/6) later, whatever the rounds do. Fencing cancels
//     the call's context with ErrLeaseLost: queued calls release (503
//     ledger_unavailable), running ones abort upstream.
//   - The outbox loop (settle/outbox.go) owns the pending-writes log: the
//     unacknowledged endings (Release for never-dispatched holds, leaving
//     a tombstone for an ambiguous Reserve that never applied; Settle for
//     dispatched ones) and the owed outage charges (settle/outage.go), in
//     one file so that a restart finishes them; every Settle is written there
//     before it is sent, so a kill while it is in flight is finished the
//     same way.
//   - The clamp loop applies automatic clamps (off the request goroutine)
//     and expires clamps; the admin loop installs admin changes other
//     instances wrote to the shared state store. Server.polMu serializes
//     every policy change.
//
// Every loop runs under one supervisor, [Server.Run] (supervise.go): the
// server's own and the process's, which node.Run hands over with
// [Server.Attach] (connection watch, poller, GPU monitor, observation,
// ledger, share exchange, key watch, audit trail). Each is wrapped by
// [Server.Supervise]: a loop that fails is logged, fails /readyz naming
// itself, and its error is returned when the process stops. The server's
// own loops stop after the drain, the attached ones after the
// pending-writes log's last pass, which needs the ledger's.
//
// Operators change budgets and clamps through the admin API (adminops.go);
// each change builds a new policy on top of the config file, so queued and
// running requests keep the limits they were admitted under. With a shared
// state store (Deps.State) the admin state is one document written by
// compare-and-set and polled every second, so a change through any instance
// applies to the fleet. Automatic clamps (package abuse) use the same path.
//
// apierr.For is the one place that maps outcomes to HTTP statuses and the
// pinned error codes of ARCHITECTURE.md §3.3.
package scheduler
