package singleflight

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewer renews the leases of every flight this process owns, all at once every
// HeartbeatInterval: one pipeline (go-redis splits it per Cluster node), then one message on
// the instance's alive channel, which lets followers everywhere wait without looking their
// flights up. Ten thousand owned flights cost one goroutine and one round trip per
// interval, not ten thousand of each.
//
// A renewal belongs to its attempt: it is registered when the owner function starts and
// removed at the attempt's final write; it is skipped once the attempt's hard timeout ran
// out, so a stuck owner function can never be kept alive by it.
//
// A lease whose final write is on its way to Redis is no longer renewed: a renewal sent
// after it reaches Redis behind it and finds the flight over (or, if the write fails, the
// attempt is abandoned and its followers are told). One whose final write is still queued
// in the batcher is renewed half an interval into the round, if it is queued still. When
// ten thousand flights end at once, a round would otherwise put ten thousand renewals in
// the Redis thread their final writes are waiting on.
type renewer struct {
	r *remote

	round atomic.Int64 // renewal rounds begun (tests name them)

	mu      sync.Mutex
	owned   map[*renewal]struct{}
	gone    []string // tokens no longer renewed without a final write: said in the next alive
	started bool
}

// renewal is one owned attempt's lease.
type renewal struct {
	o      *remoteOwnership
	ctx    context.Context         // the attempt under its hard timeout
	cancel context.CancelCauseFunc // owner suicide: ErrLeaseLost
	said   bool                    // its end of renewals was said on the alive channel
}

func newRenewer(r *remote) *renewer { return &renewer{r: r, owned: map[*renewal]struct{}{}} }

// abandon says, with the next alive message, that token is no longer renewed although its
// flight may look running (its final write failed): its followers stop trusting alive
// messages for it and look it up.
func (rn *renewer) abandon(token string) {
	rn.mu.Lock()
	rn.gone = append(rn.gone, token)
	rn.mu.Unlock()
}

// add registers an attempt's lease until the returned stop is called.
func (rn *renewer) add(ctx context.Context, o *remoteOwnership, cancel context.CancelCauseFunc) (stop func()) {
	rl := &renewal{o: o, ctx: ctx, cancel: cancel}
	rn.mu.Lock()
	rn.owned[rl] = struct{}{}
	if !rn.started {
		// The first owner starts the loop; the leader goroutine calling add is counted by
		// the Group's WaitGroup, so adding to it is safe.
		rn.started = true
		rn.r.g.wg.Add(1)
		go rn.loop()
	}
	rn.mu.Unlock()
	return sync.OnceFunc(func() {
		rn.mu.Lock()
		delete(rn.owned, rl)
		rn.mu.Unlock()
	})
}

func (rn *renewer) loop() {
	g := rn.r.g
	defer g.wg.Done()
	t := time.NewTicker(g.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		begun := time.Now()
		rn.round.Add(1)
		batch, later, gone, passed := rn.due(nil)
		if len(batch) > 0 || gone != "" || passed || len(later) > 0 {
			// The alive message goes every round, with the first pipeline or alone.
			rn.send(batch, gone)
		}
		if len(later) == 0 {
			continue
		}
		// Final writes queued in the batcher: most go out within moments of a herd's end.
		// Half an interval on, those still queued are renewed; the lease they hold from
		// the round before covers that with an interval and a half to spare.
		wait := time.NewTimer(time.Until(begun.Add(g.opts.HeartbeatInterval / 2)))
		select {
		case <-g.ctx.Done():
			wait.Stop()
			return
		case <-wait.C:
		}
		if batch, _, gone, _ = rn.due(later); len(batch) > 0 || gone != "" {
			rn.send(batch, gone)
		}
	}
}

// due sorts the attempts of only (every one owned if nil) for a round: those to renew now,
// those whose final write is queued (later: renewed half an interval on, if still queued),
// and the tokens to say gone. passed: an attempt's final write is on its way to Redis, so it
// is not renewed at all.
func (rn *renewer) due(only []*renewal) (now, later []*renewal, gone string, passed bool) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	consider := func(rl *renewal) {
		switch {
		case rl.ctx.Err() == nil && rl.o.finalSent.Load():
			passed = true
		case rl.ctx.Err() == nil && rl.o.finalQueued.Load() && only == nil:
			later = append(later, rl)
		case rl.ctx.Err() == nil:
			now = append(now, rl)
		case !rl.said:
			// Past its hard timeout, an attempt is not renewed: its followers must not
			// take the instance's alive messages for it.
			rl.said = true
			rn.gone = append(rn.gone, rl.o.token)
		}
	}
	if only == nil {
		now = make([]*renewal, 0, len(rn.owned))
		for rl := range rn.owned {
			consider(rl)
		}
	} else {
		for _, rl := range only {
			if _, ok := rn.owned[rl]; ok { // not ended since
				consider(rl)
			}
		}
	}
	gone = strings.Join(rn.gone, " ")
	rn.gone = nil
	return now, later, gone, passed
}

// send renews batch and says gone on the alive channel (with nothing to renew, the alive
// message alone).
func (rn *renewer) send(batch []*renewal, gone string) {
	g := rn.r.g
	if len(batch) == 0 {
		rn.renew(nil, gone)
		return
	}
	if g.hooks.beforeRenew != nil {
		g.hooks.beforeRenew(g.ctx)
	}
	// In pipelines of renewChunk, renewChunks at a time: a slow reply delays (or fails) a
	// few hundred renewals, not every lease this process holds, and ten thousand leases are
	// renewed in a few round trips' time, not forty.
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
			rn.renew(chunk, said)
		})
	}
	wg.Wait()
}

// renewChunk is the most renewals sent in one pipeline, and renewChunks the most
// pipelines in flight at once.
const (
	renewChunk  = 256
	renewChunks = 4
)

// pipeline sends the renewals of batch in one pipeline, and with alive the alive message
// saying the tokens gone.
func (rn *renewer) pipeline(ctx context.Context, batch []*renewal, alive bool, gone string) []*redis.Cmd {
	r := rn.r
	cmds := make([]*redis.Cmd, len(batch))
	_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, rl := range batch {
			cmds[i] = rl.o.renewCmd(ctx, p)
		}
		if alive {
			p.Publish(ctx, r.wake.aliveChannel(r.g.opts.InstanceID), gone)
		}
		return nil
	})
	return cmds
}

// renew sends one batch of renewals, and the alive message with them.
func (rn *renewer) renew(batch []*renewal, gone string) {
	r := rn.r
	g := r.g
	ctx, cancel := context.WithTimeout(g.ctx, writeTimeout(g))
	defer cancel()
	cmds := rn.pipeline(ctx, batch, true, gone)
	// A Redis that lost its scripts (a restart, a failover) answers NOSCRIPT to every
	// EVALSHA: load the script once, then send those renewals again.
	var again []int
	for i := range batch {
		if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		if renewScript.Load(ctx, r.rdb).Err() == nil {
			retry := make([]*renewal, len(again))
			for j, i := range again {
				retry[j] = batch[i]
			}
			for j, c := range rn.pipeline(ctx, retry, false, "") {
				cmds[again[j]] = c
			}
		} else {
			// The load failed somewhere (in a Cluster it goes to every node): each
			// renewal on its own, which sends the script itself where it is missing.
			for _, i := range again {
				cmds[i] = batch[i].o.renewRun(ctx)
			}
		}
	}
	for i, rl := range batch {
		err := rl.o.renewed(cmds[i].Int64())
		switch {
		case errors.Is(err, ErrLeaseLost):
			rl.cancel(ErrLeaseLost)
		case err != nil && rl.ctx.Err() == nil:
			g.observe(Event{Kind: EventHeartbeatFailed, Key: rl.o.key, Err: err})
		}
	}
}
