package singleflight

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Check asks Redis whether it can be used, so that a configuration Redis refuses shows at
// start-up: a failure that makes Redis unusable degrades the Group, as any command's would.
// Where Redis answers, it loads the protocol's scripts (ADR 0085). An in-memory Group has
// nothing to check. See ADR 0043.
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
		loadScripts(ctx, r.rdb)
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

// loadScripts loads the protocol's scripts that one server lacks, so that the first flights
// send them by SHA, not their text within a lease; a server that loses them later (a
// restart, a failover) is sent each again by the first calls that meet NOSCRIPT
// (runPipelined, ADR 0085). A refusal (an ACL without SCRIPT) changes nothing: those calls
// send the text. One at a time: Script.Load in a pipeline would take the SHA of a reply not
// read yet.
func loadScripts(ctx context.Context, c redis.Scripter) {
	hashes := make([]string, len(protocolScripts))
	for i, s := range protocolScripts {
		hashes[i] = s.Hash()
	}
	has, err := c.ScriptExists(ctx, hashes...).Result()
	if err != nil || len(has) != len(hashes) {
		return
	}
	for i, s := range protocolScripts {
		if !has[i] && s.Load(ctx, c).Err() != nil {
			return
		}
	}
}

// pingMasters sends a Cluster's masters a PING each, at once, and loads the scripts on
// those that answer. A refusal is every shard's (the proxy's credentials or ACL); a master
// that does not answer is its own shard's: a hung master degrades its shard alone, not the
// whole Cluster (ADR 0081).
func (r *remote) pingMasters(ctx context.Context, fail func(string, error) error) error {
	c := r.rdb.(*redis.ClusterClient)
	var (
		mu      sync.Mutex
		refused error
		silent  = map[string]error{}
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		err := m.Ping(ctx).Err()
		if err == nil {
			loadScripts(ctx, m)
		}
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
