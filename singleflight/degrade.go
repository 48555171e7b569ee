package singleflight

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// When Redis fails, the Group fails open per shard: a Cluster master, or "" for all of a
// standalone or Sentinel Redis. See ADR 0022.

// sharded reports whether flights live on several servers, a Cluster (ADR 0023).
func (r *remote) sharded() bool {
	_, ok := r.rdb.(*redis.ClusterClient)
	return ok
}

// shard names the master of key's slot in a Cluster, "" on one server or if not known.
func (r *remote) shard(key string) string { return r.shardOf(r.keys(key).meta) }

// shardOf names the server that holds the Redis key rkey (see shard).
func (r *remote) shardOf(rkey string) string {
	c, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(r.g.ctx, time.Second)
	defer cancel()
	m, err := c.MasterForKey(ctx, rkey) // the layout this client holds: no I/O once known
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// reloadLayout asks the Cluster client to reload the slot layout soon: a dead master sends
// no MOVED, and its keys would go to it for a minute after its replica was promoted.
func (r *remote) reloadLayout() {
	if c, ok := r.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(r.g.ctx)
	}
}

// degradedFor reports whether key's flights must run local-only now.
func (r *remote) degradedFor(key string) bool { return r.degradedAt(r.keys(key).meta) }

// degradedAt reports whether the server that holds the Redis key rkey is degraded.
func (r *remote) degradedAt(rkey string) bool {
	if !r.g.degraded.Load() {
		return false
	}
	s := r.shardOf(rkey)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.down[""] || r.down[s]
}

// degrade marks shard unusable until a probe finds it answering. Group.degraded, down and
// probing change under one lock: a failure while a probe ends leaves one running.
// Its calls queued or sent in a shared pipeline end at once (ADR 0063).
func (r *remote) degrade(shard string, cause error) {
	r.mu.Lock()
	if r.down[shard] {
		r.mu.Unlock()
		return
	}
	r.down[shard] = true
	r.g.observe(Event{Kind: EventShardDown, Op: shard, Err: cause})
	if !r.g.degraded.Load() {
		r.g.degraded.Store(true)
		r.g.observe(Event{Kind: EventDegraded, Op: shard, Err: cause})
	}
	if !r.probing && r.g.counted() {
		r.probing = true
		go r.probe()
	}
	r.mu.Unlock()
	r.coalesce.shed(shard)
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
				delete(r.hung, s)
				r.g.observe(Event{Kind: EventShardUp, Op: s})
			}
		}
		if len(r.down) == 0 {
			r.probing = false
			r.g.degraded.Store(false)
			r.recovered = time.Now()
			r.g.observe(Event{Kind: EventRecovered})
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// answering asks which shards answer: one server when it takes a write; a Cluster's when
// its master answers a PING or is no master any more (a replica was promoted).
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
	// ForEachMaster reloads the layout first: a promoted replica is seen.
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

// shardUsable reports whether the shard named shard is neither down nor suspected.
func (r *remote) shardUsable(shard string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.down[""] && !r.down[shard] && !r.suspect[shard]
}

// suspected reports whether a timeout on key's shard is being confirmed (see confirm):
// meanwhile no caller sends it a command it would wait on (ADR 0056).
func (r *remote) suspected(key string) bool {
	if r.suspects.Load() == 0 {
		return false
	}
	s := r.shard(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.suspect[s]
}

// hangingFor reports whether key's shard is down because it hangs: a timeout that a PING
// confirmed, not a refusal.
func (r *remote) hangingFor(key string) bool {
	if !r.g.degraded.Load() {
		return false
	}
	s := r.shard(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hung[s]
}

// unusable reports whether key's shard is degraded or suspected.
func (r *remote) unusable(key string) bool { return r.degradedFor(key) || r.suspected(key) }

// usableAfterVerdict reports whether key's shard can be used, once the PING that confirms
// a suspicion of it (see confirm) has ended: at most half a deadline on, or when ctx ends.
// A suspicion is a slow operation, which a slow link or a busy process makes as well as a
// hang: a caller that found Redis answering goes on with it, instead of a call of its own
// that other instances would not share (ADR 0062).
func (r *remote) usableAfterVerdict(ctx context.Context, key string) bool {
	r.awaitVerdict(ctx, key)
	return !r.unusable(key)
}

// awaitVerdict waits while key's shard is suspected, at most half a deadline, the PING's own.
func (r *remote) awaitVerdict(ctx context.Context, key string) {
	if r.suspects.Load() == 0 {
		return
	}
	r.awaitShard(ctx, r.shard(key))
}

// awaitShard is awaitVerdict for shard s.
func (r *remote) awaitShard(ctx context.Context, s string) {
	if r.suspects.Load() == 0 {
		return
	}
	t := time.NewTimer(r.g.opts.RedisTimeout / 2)
	defer t.Stop()
	for {
		r.mu.Lock()
		suspected, verdict := r.suspect[s], r.verdict
		r.mu.Unlock()
		if !suspected {
			return
		}
		select {
		case <-verdict: // a PING ended; this shard's, or another's: look again
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// confirm degrades the shard that holds the Redis key rkey if it does not answer a PING on
// a connection of its own within half a deadline: an operation that timed out may have waited
// for a pooled connection of a busy process, not on a Redis that hangs (ADR 0056).
func (r *remote) confirm(rkey string, cause error) {
	r.confirmBy(rkey, cause, time.Now().Add(r.g.opts.RedisTimeout/2))
}

// confirmBy is confirm with a PING that ends by deadline, at most half a deadline from now:
// the verdict on a watched operation is in by the operation's own deadline (ADR 0056).
func (r *remote) confirmBy(rkey string, cause error, deadline time.Time) {
	shard := r.shardOf(rkey)
	r.mu.Lock()
	if r.down[shard] || r.suspect[shard] || !r.g.counted() { // counted: the PING's goroutine
		r.mu.Unlock()
		return
	}
	r.suspect[shard] = true
	r.suspects.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.g.wg.Done()
		err := r.pingAlone(rkey, deadline)
		answers := err == nil
		if !answers {
			r.degrade(shard, cause)
			if timedOut(err) { // a hang, not a refusal (a restart): see ADR 0023
				r.mu.Lock()
				r.hung[shard] = r.down[shard]
				r.mu.Unlock()
				r.wake.WakeAll() // its followers take their flights over
				r.wake.Leave(shard)
			}
			r.reloadLayout()
		}
		r.mu.Lock()
		delete(r.suspect, shard)
		r.suspects.Add(-1)
		close(r.verdict)
		r.verdict = make(chan struct{})
		r.mu.Unlock()
		if r.g.hooks.confirmed != nil {
			r.g.hooks.confirmed(answers)
		}
	}()
}

// pingAlone sends a PING to the server that holds rkey, on a connection dialled for it,
// and says why it did not answer by deadline, or within half a deadline (nil: it did). Any
// reply counts, a refusal included.
func (r *remote) pingAlone(rkey string, deadline time.Time) error {
	if half := time.Now().Add(r.g.opts.RedisTimeout / 2); half.Before(deadline) {
		deadline = half
	}
	ctx, cancel := context.WithDeadline(r.g.ctx, deadline)
	defer cancel()
	var c *redis.Client
	switch rdb := r.rdb.(type) {
	case *redis.Client:
		c = rdb
	case *redis.ClusterClient:
		var err error
		if c, err = rdb.MasterForKey(ctx, rkey); err != nil {
			return err
		}
	default:
		return errSlow
	}
	o := c.Options()
	conn, err := o.Dialer(ctx, o.Network, o.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	var b [1]byte
	_, err = conn.Read(b[:])
	return err
}
