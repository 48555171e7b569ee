package singleflight

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// When Redis fails, the Group fails open: flights whose Redis cannot be used run in this
// process alone, and a probe watches until it answers again. In a Cluster the unit is the
// shard (the master that holds a key's slot), not the whole Redis: a failing-over shard
// sends only its own keys local, and flights on the healthy shards keep their distributed
// dedupe. Standalone and Sentinel have one shard, named "".

// sharded reports whether flights live on several servers (a Cluster). On one server the
// alive messages travel with the renewals, in the same pipeline on the same connection:
// one heard says that every lease its instance held was just renewed, and none comes
// while that server is down.
func (r *remote) sharded() bool {
	_, ok := r.rdb.(*redis.ClusterClient)
	return ok
}

// shard names the Redis server that holds key's flight: the address of its slot's master
// in a Cluster, "" for standalone and Sentinel, where one server holds everything, or when
// the Cluster's layout is not known.
func (r *remote) shard(key string) string {
	c, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(r.g.ctx, time.Second)
	defer cancel()
	m, err := c.MasterForKey(ctx, r.keys(key).meta) // the layout this client holds: no I/O once known
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// reloadLayout asks the Cluster client to reload the slot layout soon (once, however
// often it is asked). go-redis reloads it on MOVED and every minute, but a dead master
// sends no MOVED: without this, its keys would go to the dead address for a minute after
// its replica was promoted.
func (r *remote) reloadLayout() {
	if c, ok := r.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(r.g.ctx)
	}
}

// degradedFor reports whether key's flights must run local-only now.
func (r *remote) degradedFor(key string) bool {
	if !r.g.degraded.Load() {
		return false
	}
	s := r.shard(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.down[""] || r.down[s]
}

// degrade marks shard unusable until a probe finds it answering. Group.degraded says
// whether any shard is down; it, down and probing change together under one lock, so that
// a failure reported while a probe is ending always leaves a probe running.
func (r *remote) degrade(shard string, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down[shard] {
		return
	}
	r.down[shard] = true
	r.g.observe(Event{Kind: EventShardDown, Op: shard, Err: cause})
	if !r.g.degraded.Load() {
		r.g.degraded.Store(true)
		r.g.observe(Event{Kind: EventDegraded, Op: shard, Err: cause})
	}
	if r.probing {
		return
	}
	r.g.mu.Lock()
	closed := r.g.closed
	if !closed {
		r.g.wg.Add(1)
	}
	r.g.mu.Unlock()
	if closed {
		return
	}
	r.probing = true
	go r.probe()
}

// probe checks the shards that are down every 250 ms until none is.
func (r *remote) probe() {
	defer r.g.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-r.g.ctx.Done():
			r.mu.Lock()
			r.probing = false
			r.mu.Unlock()
			return
		case <-t.C:
		}
		up := r.answering()
		if r.g.hooks.probed != nil {
			r.g.hooks.probed()
		}
		r.mu.Lock()
		for s := range r.down {
			if up(s) {
				delete(r.down, s)
				r.g.observe(Event{Kind: EventShardUp, Op: s})
			}
		}
		if len(r.down) == 0 {
			r.probing = false
			r.g.degraded.Store(false)
			r.g.observe(Event{Kind: EventRecovered})
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// answering asks Redis which shards answer now. The whole Redis ("") answers when it takes
// a write (see usable); a Cluster, when any of its masters answers a PING (a server that is
// no Cluster has none). In a Cluster, a shard answers when its master answers a PING, or
// when it is no master any more: its slots moved to a promoted replica, which a reloaded
// layout names instead.
func (r *remote) answering() func(shard string) bool {
	ctx, cancel := context.WithTimeout(r.g.ctx, time.Second)
	defer cancel()
	c, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		whole := r.usable(ctx, r.rdb) == nil
		return func(string) bool { return whole }
	}
	var mu sync.Mutex
	masters := map[string]bool{} // address → answers
	// ForEachMaster reloads the layout first, so that a promoted replica is seen.
	_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		err := m.Ping(ctx).Err()
		mu.Lock()
		masters[m.Options().Addr] = err == nil
		mu.Unlock()
		return err
	})
	whole := false
	for _, ok := range masters {
		whole = whole || ok
	}
	return func(shard string) bool {
		if shard == "" {
			return whole
		}
		ok, isMaster := masters[shard]
		return ok || !isMaster && len(masters) > 0
	}
}
