package statestore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Redis is a [Store] on Redis (standalone, Sentinel or Cluster). Document
// name lives in the hash <prefix>:{state:<name>} with fields rev, epoch and data;
// the braces make the whole key the Cluster hash tag, and every script
// touches that one key only. Redis is safe for concurrent use. The client
// should have ContextTimeoutEnabled, so that ctx bounds every round trip.
type Redis struct {
	c      redis.UniversalClient
	prefix string
}

// NewRedis returns a Redis store using c under key prefix (e.g. the
// ledger's key_prefix, "sluice"). It does not own c.
func NewRedis(c redis.UniversalClient, prefix string) *Redis {
	if prefix == "" {
		prefix = "sluice"
	}
	return &Redis{c: c, prefix: prefix}
}

func (r *Redis) key(name string) string { return r.prefix + ":{state:" + name + "}" }

// casScript sets rev+1 and data when the stored rev equals ARGV[1] and
// returns {new rev, epoch}; otherwise it writes nothing and returns
// {-(stored rev)-1}, so a conflict is told apart from any success. A hash
// without an epoch (a new document, or one written before epochs) takes
// ARGV[3].
var casScript = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if cur ~= tonumber(ARGV[1]) then return {-cur - 1} end
local ep = redis.call('HGET', KEYS[1], 'epoch')
if not ep then ep = ARGV[3] end
redis.call('HSET', KEYS[1], 'rev', cur + 1, 'epoch', ep, 'data', ARGV[2])
return {cur + 1, ep}
`)

// Get reads the current revision of name.
func (r *Redis) Get(ctx context.Context, name string) (Doc, error) {
	if err := checkName(name); err != nil {
		return Doc{}, err
	}
	vals, err := r.c.HMGet(ctx, r.key(name), "rev", "data", "epoch").Result()
	if err != nil {
		return Doc{}, fmt.Errorf("statestore: get %s: %w", name, err)
	}
	if vals[0] == nil {
		return Doc{Name: name}, nil
	}
	rs, _ := vals[0].(string)
	rev, err := strconv.ParseUint(rs, 10, 64)
	if err != nil {
		return Doc{}, fmt.Errorf("statestore: %s: corrupt revision %q", name, rs)
	}
	ds, _ := vals[1].(string)
	ep, _ := vals[2].(string)
	return Doc{Name: name, Rev: rev, Epoch: ep, Data: []byte(ds)}, nil
}

// CompareAndSet writes data as revision rev+1 if name is at rev.
func (r *Redis) CompareAndSet(ctx context.Context, name string, rev uint64, data []byte) (Doc, error) {
	if err := checkName(name); err != nil {
		return Doc{}, err
	}
	res, err := casScript.Run(ctx, r.c, []string{r.key(name)}, rev, data, newEpoch()).Slice()
	if err != nil {
		return Doc{}, fmt.Errorf("statestore: set %s: %w", name, err)
	}
	n, _ := res[0].(int64)
	if n < 0 {
		return Doc{}, fmt.Errorf("%s at revision %d, not %d: %w", name, -n-1, rev, ErrConflict)
	}
	var ep string
	if len(res) > 1 {
		ep, _ = res[1].(string)
	}
	return Doc{Name: name, Rev: uint64(n), Epoch: ep, Data: append([]byte(nil), data...)}, nil
}
