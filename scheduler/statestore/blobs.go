package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisBlobs keeps short-lived values shared by a fleet (the bodies of
// completed idempotent responses) in <prefix>:{blob:<name>}, each with its
// own expiry. Unlike a [Store] document a blob is written once and never
// compared-and-set; a later Put of the same name replaces it.
type RedisBlobs struct {
	c      redis.UniversalClient
	prefix string
}

// NewRedisBlobs returns blobs on c under key prefix ("sluice" when empty).
// It does not own c.
func NewRedisBlobs(c redis.UniversalClient, prefix string) *RedisBlobs {
	if prefix == "" {
		prefix = "sluice"
	}
	return &RedisBlobs{c: c, prefix: prefix}
}

func (r *RedisBlobs) key(name string) string { return r.prefix + ":{blob:" + name + "}" }

// Put stores data under name for ttl.
func (r *RedisBlobs) Put(ctx context.Context, name string, data []byte, ttl time.Duration) error {
	if err := r.c.Set(ctx, r.key(name), data, ttl).Err(); err != nil {
		return fmt.Errorf("statestore: put blob: %w", err)
	}
	return nil
}

// Get reads name; ok is false when it does not exist or expired.
func (r *RedisBlobs) Get(ctx context.Context, name string) (data []byte, ok bool, err error) {
	b, err := r.c.Get(ctx, r.key(name)).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("statestore: get blob: %w", err)
	}
	return b, true, nil
}
