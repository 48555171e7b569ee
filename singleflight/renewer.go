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
// A lease whose final write is on its way is passed over by the next round: the write
// ends it, and when ten thousand flights end at once (a herd answered together) their
// ten thousand renewals would only queue in Redis behind the writes. The rounds after
// renew it again, so a slow final write keeps its lease: the round before the write
// renewed it for LeaseTTL, and the skip is made only when that covers two intervals more
// (LeaseTTL ≥ 3 × HeartbeatInterval, as by default).
type renewer struct {
	r *remote

	round atomic.Int64 // renewal rounds begun

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
		round := rn.round.Add(1)
		rn.mu.Lock()
		batch := make([]*renewal, 0, len(rn.owned))
		passed := false
		for rl := range rn.owned {
			switch {
			case rl.ctx.Err() == nil && rl.o.passOver.Load() == round:
				passed = true // its final write was sent since the last round began
			case rl.ctx.Err() == nil:
				batch = append(batch, rl)
			case !rl.said:
				// Past its hard timeout, an attempt is not renewed: its followers must
				// not take the instance's alive messages for it.
				rl.said = true
				rn.gone = append(rn.gone, rl.o.token)
			}
		}
		gone := strings.Join(rn.gone, " ")
		rn.gone = nil
		rn.mu.Unlock()
		if len(batch) == 0 {
			if gone != "" || passed {
				rn.renew(nil, gone) // nothing to renew: the alive message alone
			}
			continue
		}
		if g.hooks.beforeRenew != nil {
			g.hooks.beforeRenew(g.ctx)
		}
		// In pipelines of renewChunk, renewChunks at a time: a slow reply delays (or
		// fails) a few hundred renewals, not every lease this process holds, and ten
		// thousand leases are renewed in a few round trips' time, not forty.
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
}

// finalSent notes that o's final write is being sent: the next renewal round passes o over
// when its lease outlasts two more intervals.
func (rn *renewer) finalSent(o *remoteOwnership) {
	if opts := rn.r.g.opts; opts.LeaseTTL >= 3*opts.HeartbeatInterval {
		o.passOver.Store(rn.round.Load() + 1)
	}
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
