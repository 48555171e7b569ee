package singleflight

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Check asks Redis whether it can be used, so that a configuration Redis refuses (a wrong
// password, a TLS certificate not trusted, a database index out of range, a Cluster's
// address list naming a server that is no Cluster, a read-only replica) shows at start-up
// and not at the first request: a failure that makes Redis unusable degrades the Group, as
// any command's would, and is reported with EventDegraded. An in-memory Group has nothing
// to check.
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
	// In a Cluster the probe key lives on one shard: a PING (any master) says whether the
	// Cluster answers at all, the write whether that shard takes the scripts; a failing
	// write degrades its shard alone (the whole Redis where the layout is unknown, as when
	// the server is no Cluster).
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		return fail("", err) // a Cluster that refuses a PING refuses every shard
	}
	if err := r.usable(ctx, r.rdb); err != nil {
		return fail(r.shard(r.probeKey()), err)
	}
	return nil
}

// usableScript writes and publishes, as the proxy's scripts do: a PING is answered by a
// server that refuses every one of them (a read-only replica), or an ACL user that may not
// publish on the proxy's channels, so the probe of a degraded Redis would find it well at
// once, and the next script degrade it again.
var usableScript = redis.NewScript(`redis.call('PUBLISH', KEYS[1], '')
return redis.call('PEXPIRE', KEYS[1], 1)`)

// usable runs usableScript on c, on a key of the Group's own (the ACL the proxy needs
// covers it); a key that does not exist is left so.
func (r *remote) usable(ctx context.Context, c redis.Scripter) error {
	return usableScript.Run(ctx, c, []string{r.probeKey()}).Err()
}

func (r *remote) probeKey() string { return r.g.opts.KeyPrefix + ":probe" }
