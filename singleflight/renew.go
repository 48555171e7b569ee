package singleflight

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A round of renewals goes in one pipeline per shard (a Cluster master, or "" for one
// server), each on a goroutine of its own with its own deadline: a master that hangs fails
// its own renewals, never another master's, and holds up no later round (ADR 0081).

// sendRound renews batch and publishes the round's alive message. A shard whose pipeline
// of an earlier round is still out is not sent to again: in a Cluster its tokens are said
// unrenewed (ADR 0057), and on one server the round says nothing, as a round that waited would.
func (rn *renewer) sendRound(batch []*renewal, begun time.Time, later bool) {
	shards, sharded := rn.byShard(batch), rn.r.sharded()
	gone := rn.said(begun)
	if len(batch) == 0 && gone == "" && !later {
		return
	}
	names := make([]string, 0, len(shards))
	for s := range shards {
		names = append(names, s)
	}
	slices.Sort(names)
	for _, s := range names {
		rn.goRenew(s, shards[s], !sharded, gone, begun) // on one server the message rides along
	}
	switch {
	case sharded:
		rn.publishAlive(names, shards, gone)
	case len(batch) == 0:
		rn.goRenew("", nil, true, gone, begun)
	}
}

// shardsOf groups batch by shard.
func (r *remote) shardsOf(batch []*renewal) map[string][]*renewal {
	shards := map[string][]*renewal{}
	for _, rl := range batch {
		s := r.shardOf(rl.o.k.meta)
		shards[s] = append(shards[s], rl)
	}
	return shards
}

// byShard groups batch by shard, leaving out the shards still busy; in a Cluster their
// tokens are said unrenewed until a renewal lands.
func (rn *renewer) byShard(batch []*renewal) map[string][]*renewal {
	r := rn.r
	shards := r.shardsOf(batch)
	rn.mu.Lock()
	defer rn.mu.Unlock()
	for s, rls := range shards {
		if !rn.busy[s] {
			continue
		}
		delete(shards, s)
		if r.sharded() {
			for _, rl := range rls {
				rn.unrenewed[rl.o.token] = struct{}{}
			}
		}
	}
	return shards
}

// goRenew sends a shard's renewals on a goroutine, which then has those that did not land
// tried again a quarter and a half interval on (ADR 0008). On one server the shard stays
// busy meanwhile even with nothing to renew: the alive message alone is sent.
func (rn *renewer) goRenew(shard string, rls []*renewal, alive bool, gone string, begun time.Time) {
	g := rn.r.g
	rn.mu.Lock()
	if rn.busy[shard] {
		rn.mu.Unlock()
		return
	}
	rn.busy[shard] = true
	rn.mu.Unlock()
	g.wg.Add(1) // the loop's own count keeps the WaitGroup above zero meanwhile
	go func() {
		defer g.wg.Done()
		rn.send(rls, alive, gone)
		rn.mu.Lock()
		delete(rn.busy, shard)
		rn.mu.Unlock()
		if failed := rn.notRenewed(rls, mono(begun)); len(failed) > 0 {
			rn.renewLater(failed, time.Now().Add(g.opts.HeartbeatInterval/4))
		}
	}()
}

// publishAlive sends a Cluster's alive message on its own, to the master of the first
// shard this round renews on that is not known to fail (else the alive channel's master):
// in a pipeline with renewals, go-redis would send it to any node, a hung one too.
func (rn *renewer) publishAlive(names []string, shards map[string][]*renewal, gone string) {
	r, g := rn.r, rn.r.g
	c, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		return
	}
	channel := r.wake.AliveChannel(g.opts.InstanceID)
	key := channel
	for _, s := range names {
		if rls := shards[s]; len(rls) > 0 && !r.unusable(rls[0].o.key) {
			key = rls[0].o.k.meta
			break
		}
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		ctx, cancel := context.WithTimeout(g.ctx, g.opts.RedisTimeout)
		defer cancel()
		m, err := c.MasterForKey(ctx, key) // the layout this client holds: no I/O once known
		if err != nil {
			return
		}
		_ = m.Publish(ctx, channel, gone).Err()
	}()
}

// sendShards renews batch, one pipeline per shard at once, and returns when all did.
func (rn *renewer) sendShards(batch []*renewal) {
	var wg sync.WaitGroup
	for _, rls := range rn.r.shardsOf(batch) {
		wg.Go(func() { rn.send(rls, false, "") })
	}
	wg.Wait()
}

// send renews batch, with the alive message saying gone when alive is set.
func (rn *renewer) send(batch []*renewal, alive bool, gone string) {
	g := rn.r.g
	if len(batch) == 0 {
		rn.renew(nil, alive, gone)
		return
	}
	if g.hooks.beforeRenew != nil {
		g.hooks.beforeRenew(g.ctx)
	}
	// renewChunks pipelines at a time: a slow reply delays a few, not all (ADR 0007).
	var wg sync.WaitGroup
	sem := make(chan struct{}, renewChunks)
	for len(batch) > 0 {
		n := min(len(batch), renewChunk)
		chunk := batch[:n]
		batch = batch[n:]
		said := gone
		gone = ""
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rn.renew(chunk, alive, said)
		})
	}
	wg.Wait()
}

// renewChunk is the most renewals in one pipeline; renewChunks, pipelines in flight.
const (
	renewChunk  = 256
	renewChunks = 4
)

// renew sends batch's renewals in one pipeline, then with alive the alive message.
func (rn *renewer) renew(batch []*renewal, alive bool, gone string) {
	r := rn.r
	g := r.g
	ctx, cancel := context.WithTimeout(g.ctx, max(g.opts.LeaseTTL, time.Second)) // off the callers' path
	defer cancel()
	sent := mono(time.Now())
	calls := make([]*scriptCall, len(batch))
	for i, rl := range batch {
		calls[i] = rl.o.renewCall()
	}
	var also func(redis.Pipeliner)
	if alive {
		also = func(p redis.Pipeliner) { p.Publish(ctx, r.wake.AliveChannel(g.opts.InstanceID), gone) }
	}
	runPipelined(ctx, r.rdb, calls, also)
	for i, rl := range batch {
		rn.renewedOne(rl, sent, calls[i].cmd)
	}
}

// renewedOne takes the answer of rl's renewal, sent at sent (mono).
func (rn *renewer) renewedOne(rl *renewal, sent int64, cmd *redis.Cmd) {
	g := rn.r.g
	v, err := cmd.Int64()
	if err == nil && v == cutRenew || rl.o.cutIn.Load() {
		rl.o.cutLearned() // by this renewal, or by a reply that told of it meanwhile (ADR 0074)
		return
	}
	err = rl.o.renewed(sent, v, err)
	rn.mu.Lock()
	_, owned := rn.owned[rl] // not stopped meanwhile
	if owned && err != nil && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrFlightGone) && rl.ctx.Err() == nil {
		rn.unrenewed[rl.o.token] = struct{}{}
	} else {
		delete(rn.unrenewed, rl.o.token)
	}
	rn.mu.Unlock()
	switch {
	case errors.Is(err, ErrLeaseLost):
		rl.cancel(ErrLeaseLost)
	case errors.Is(err, ErrFlightGone):
		// The call goes on for this process's callers alone (ADR 0011), and is cut here
		// once none has waited for the grace: no follower elsewhere can find it.
		rn.mu.Lock()
		delete(rn.owned, rl)
		rn.sayGone(rl.o.token)
		rn.mu.Unlock()
		g.observe(Event{Kind: EventHeartbeatFailed, Key: rl.o.key, Err: err})
		if d, idle := rl.o.idleFor(); idle && d >= g.opts.AbandonGrace {
			rl.o.cutLearned()
		}
	case err != nil && rl.ctx.Err() == nil:
		g.observe(Event{Kind: EventHeartbeatFailed, Key: rl.o.key, Err: err})
	}
}
