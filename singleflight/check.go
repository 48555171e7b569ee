package singleflight

import (
	"context"
	"sync"

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
	// A PING to every master: does the Cluster answer; the write: does the probe key's
	// shard take scripts.
	if err := r.pingMasters(ctx, fail); err != nil {
		return err
	}
	if r.degradedAt(r.probeKey()) {
		return nil // its master did not answer the PING
	}
	if err := r.usable(ctx, r.rdb); err != nil {
		return fail(r.shard(r.probeKey()), err)
	}
	return nil
}

// pingMasters sends a Cluster's masters a PING each, at once. A refusal is every shard's
// (the proxy's credentials or ACL); a master that does not answer is its own shard's: a
// hung master degrades its shard alone, not the whole Cluster (ADR 0081).
func (r *remote) pingMasters(ctx context.Context, fail func(string, error) error) error {
	c := r.rdb.(*redis.ClusterClient)
	var (
		mu      sync.Mutex
		refused error
		silent  = map[string]error{}
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		err := m.Ping(ctx).Err()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
		case Refused(err) != NotRefused:
			refused = err
		default:
			silent[m.Options().Addr] = err
		}
		return nil
	})
	switch {
	case err != nil:
		return fail("", err) // no node answered with the layout
	case refused != nil:
		return fail("", refused) // a Cluster that refuses a PING refuses every shard
	}
	for shard, err := range silent {
		_ = fail(shard, err)
	}
	for _, err := range silent {
		return err
	}
	return nil
}

// usable runs usableScript on a key the proxy's ACL covers; an absent key is left so.
func (r *remote) usable(ctx context.Context, c redis.Scripter) error {
	return usableScript.Run(ctx, c, []string{r.probeKey()}).Err()
}

func (r *remote) probeKey() string { return r.g.opts.KeyPrefix + ":probe" }
