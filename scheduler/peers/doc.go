// Package peers lets the Sluice instances of a fleet that share replicas
// see each other's demand on them, so that each can take a fair share of a
// shared replica's batch (SCHEDULING.md §9).
//
// Every instance calls [Redis.Exchange] a few times a second with, per
// replica URL, its requests in flight there and the requests it has queued
// that the replica could serve, and the same by tenant ([TenantDemand]),
// so that the batch is split by the tenants' weights whichever instance
// each sends to. One Lua call writes that report into the
// hash <prefix>:{peers} under the instance's id, stamped with Redis's own
// clock (so the instances' clocks never matter), drops reports older than
// the staleness bound, and returns every other live instance's report. A
// stopped instance removes its report ([Redis.Leave]); a crashed one's
// ages out.
//
// # Design rationale
//
// One hash, one key: a single slot on Redis Cluster, one round trip per
// exchange, and no pub/sub connection that can drop messages silently (a
// missed exchange is repaired by the next). The reports are a few bytes per
// replica; a fleet of a hundred instances reads a few kilobytes per
// exchange. What an instance does with them (the split) is the scheduler's:
// this package only carries them.
package peers
