package node

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/peers"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// fleetStores is what the instances of a fleet share besides the ledger.
type fleetStores struct {
	state statestore.Store
	// responses is the fleet's idempotent response store and peers the
	// exchange of replica demand, both in the Redis layout only (nil
	// otherwise: one instance keeps its own responses and has no peers).
	responses *statestore.RedisBlobs
	peers     *peers.Redis
	close     func() error // releases what openStateStore opened
}

// openStateStore returns the store of fleet-shared state (the run-time API
// keys): Redis, with its own client, when the ledger is in Redis; files in
// the journal's directory with the embedded ledger and a journal; memory
// otherwise (nothing else survives a restart then either). In the Redis
// layout the response store and the peer exchange use the same client.
func openStateStore(cfg *config.File) (fleetStores, error) {
	switch {
	case cfg.Ledger.Backend == "redis":
		r := cfg.Ledger.Redis
		opts := &redis.UniversalOptions{Addrs: r.Addrs, MasterName: r.MasterName,
			DialTimeout: r.StoreTimeout, ReadTimeout: r.StoreTimeout, WriteTimeout: r.StoreTimeout, ContextTimeoutEnabled: true}
		if r.PasswordEnv != "" {
			opts.Password = os.Getenv(r.PasswordEnv)
		}
		c := redis.NewUniversalClient(opts)
		return fleetStores{state: statestore.NewRedis(c, r.KeyPrefix), responses: statestore.NewRedisBlobs(c, r.KeyPrefix),
			peers: peers.NewRedis(c, r.KeyPrefix, instanceID(), hostname(), scheduler.ShareStale), close: c.Close}, nil
	case cfg.Ledger.Journal != "":
		f, err := statestore.OpenFile(filepath.Dir(cfg.Ledger.Journal))
		if err != nil {
			return fleetStores{}, err
		}
		return fleetStores{state: f, close: func() error { return nil }}, nil
	default:
		return fleetStores{state: statestore.NewMemory(), close: func() error { return nil }}, nil
	}
}

// instanceID names this process among a fleet's: host, pid and a random
// part (a restarted process on a reused pid is another instance).
func instanceID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%x", hostname(), os.Getpid(), b)
}

// hostname is this host's name, or "unknown-host" when the kernel does not
// say (then every instance on such hosts shares loopback replicas' names).
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}
