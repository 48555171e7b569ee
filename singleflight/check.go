package singleflight

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Check asks Redis whether it can be used, so that a configuration Redis refuses shows at
// start-up: a failure that makes Redis unusable degrades the Group, as any command's would.
// An in-memory Group has nothing to check. See ADR 0043.
func (g *Group) Check(ctx context.Context) error { return g.coord.check(ctx) }

func (r *remote) check(ctx context.Context) error {
	fail := func(shard string, err error) error {
		r.g.observe(Event{Kind: EventRedisError, Op: "ping", Err: err})
		if unavailable(err) {
			r.degrade(shard, err)
		}
		return err
	}
	if !r.sharded() {
		if err := r.usable(ctx, r.rdb); err != nil {
			return fail("", err)
		}
		return nil
	}
	// A PING: does the Cluster answer; the write: does the probe key's shard take scripts.
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		return fail("", err) // a Cluster that refuses a PING refuses every shard
	}
	if err := r.usable(ctx, r.rdb); err != nil {
		return fail(r.shard(r.probeKey()), err)
	}
	return nil
}

// usable runs usableScript on a key the proxy's ACL covers; an absent key is left so.
func (r *remote) usable(ctx context.Context, c redis.Scripter) error {
	return usableScript.Run(ctx, c, []string{r.probeKey()}).Err()
}

func (r *remote) probeKey() string { return r.g.opts.KeyPrefix + ":probe" }
