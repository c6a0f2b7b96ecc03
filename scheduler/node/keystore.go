package node

import (
	"os"
	"path/filepath"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// openStateStore returns the store of fleet-shared state (the run-time API
// keys): Redis, with its own client, when the ledger is in Redis; files in
// the journal's directory with the embedded ledger and a journal; memory
// otherwise (nothing else survives a restart then either). In the Redis
// layout it also returns the fleet's idempotent response store on the same
// client (nil otherwise: one instance keeps its own). The returned close
// func releases what it opened.
func openStateStore(cfg *config.File) (statestore.Store, *statestore.RedisBlobs, func() error, error) {
	switch {
	case cfg.Ledger.Backend == "redis":
		r := cfg.Ledger.Redis
		opts := &redis.UniversalOptions{Addrs: r.Addrs, MasterName: r.MasterName,
			DialTimeout: r.StoreTimeout, ReadTimeout: r.StoreTimeout, WriteTimeout: r.StoreTimeout, ContextTimeoutEnabled: true}
		if r.PasswordEnv != "" {
			opts.Password = os.Getenv(r.PasswordEnv)
		}
		c := redis.NewUniversalClient(opts)
		return statestore.NewRedis(c, r.KeyPrefix), statestore.NewRedisBlobs(c, r.KeyPrefix), c.Close, nil
	case cfg.Ledger.Journal != "":
		f, err := statestore.OpenFile(filepath.Dir(cfg.Ledger.Journal))
		if err != nil {
			return nil, nil, nil, err
		}
		return f, nil, func() error { return nil }, nil
	default:
		return statestore.NewMemory(), nil, func() error { return nil }, nil
	}
}
