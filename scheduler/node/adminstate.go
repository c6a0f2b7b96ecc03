package node

import (
	"os"
	"path/filepath"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// openAdminState returns the fleet-shared store of the admin state (budgets
// and clamps set through the admin API): Redis, with its own small client,
// in the Redis layout, so a change through any instance applies to all;
// files next to the journal in the embedded layout. Without either it is
// nil and admin.state_file alone keeps the state (one instance). close
// releases what it opened.
func openAdminState(cfg *config.File) (st statestore.Store, closeFn func() error, err error) {
	switch {
	case cfg.Ledger.Backend == "redis":
		r := cfg.Ledger.Redis
		opts := &redis.UniversalOptions{Addrs: r.Addrs, MasterName: r.MasterName, PoolSize: 2,
			DialTimeout: r.StoreTimeout, ReadTimeout: r.StoreTimeout, WriteTimeout: r.StoreTimeout, ContextTimeoutEnabled: true}
		if r.PasswordEnv != "" {
			opts.Password = os.Getenv(r.PasswordEnv)
		}
		c := redis.NewUniversalClient(opts)
		return statestore.NewRedis(c, r.KeyPrefix), c.Close, nil
	case cfg.Ledger.Journal != "":
		f, err := statestore.OpenFile(filepath.Dir(cfg.Ledger.Journal))
		if err != nil {
			return nil, nil, err
		}
		return f, func() error { return nil }, nil
	}
	return nil, func() error { return nil }, nil
}
