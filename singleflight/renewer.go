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
// An attempt whose final write is being made is not renewed at the round's start: it is
// renewed later, when an interval of its lease is left (at most an interval on), and only
// if the write has not returned by then. When ten thousand flights end at once, their final
// writes wait in the batcher for most of a second, and a round in that window would
// otherwise queue ten thousand renewals, for flights about to end, in the Redis thread the
// writes are waiting on. An interval of lease is what a renewal has left when the one
// before it failed: the wait never takes a lease lower than that. A lease whose last renewal
// failed, or a round running late, renews at once.
type renewer struct {
	r *remote

	round atomic.Int64 // renewal rounds begun (tests name them)

	mu    sync.Mutex
	owned map[*renewal]struct{}
	// gone: tokens no longer renewed without a final write, each said in the alive
	// messages until its time: for a lease's worth of rounds, so that a follower whose
	// subscription was being made again (the same Redis trouble that ended the attempt)
	// still hears it.
	gone    map[string]time.Time
	started bool
}

// sayGone has the alive messages say token gone (once); rn.mu held.
func (rn *renewer) sayGone(token string) {
	if _, ok := rn.gone[token]; !ok {
		rn.gone[token] = time.Now().Add(rn.r.g.opts.LeaseTTL)
	}
}

// renewal is one owned attempt's lease.
type renewal struct {
	o      *remoteOwnership
	ctx    context.Context         // the attempt under its hard timeout
	cancel context.CancelCauseFunc // owner suicide: ErrLeaseLost
	said   bool                    // its end of renewals was said on the alive channel
	// later: a renewLater goroutine will renew it (rounds leave it to that one); rn.mu.
	later bool
}

// notRenewedSince reports whether rl, still within its hard timeout, got no lease from a
// renewal sent at or after t (mono): its renewal failed (a fenced one has its context
// ended).
func (rl *renewal) notRenewedSince(t int64) bool {
	return rl.ctx.Err() == nil && rl.o.leaseFrom.Load() < t
}

func newRenewer(r *remote) *renewer {
	return &renewer{r: r, owned: map[*renewal]struct{}{}, gone: map[string]time.Time{}}
}

// abandon says, with the next alive message, that token is no longer renewed although its
// flight may look running (its final write failed): its followers stop trusting alive
// messages for it and look it up.
func (rn *renewer) abandon(token string) {
	rn.mu.Lock()
	rn.sayGone(token)
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
		batch, later, by, gone := rn.due(begun)
		if len(later) > 0 {
			// Before this round's own renewals, which may be slow, go out.
			rn.renewLater(later, by)
		}
		if len(batch) > 0 || gone != "" || len(later) > 0 {
			// The alive message goes every round, with the first pipeline or alone.
			rn.send(batch, true, gone)
		}
		// Renewals that failed (Redis did not answer) are tried again a quarter and a half
		// interval on, not at the next round only: after an outage, the first renewal to
		// reach Redis would otherwise come up to an interval late, when the lease may
		// have run out by Redis's clock and another instance taken the flight over.
		if failed := rn.notRenewed(batch, mono(begun)); len(failed) > 0 {
			rn.renewLater(failed, time.Now().Add(g.opts.HeartbeatInterval/4))
		}
	}
}

// notRenewed returns the attempts of batch, renewed in a round begun at begun (mono), that
// are still registered and were not renewed, marked for a renewLater goroutine.
func (rn *renewer) notRenewed(batch []*renewal, begun int64) []*renewal {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	var out []*renewal
	for _, rl := range batch {
		if _, ok := rn.owned[rl]; ok && !rl.later && rl.notRenewedSince(begun) {
			rl.later = true
			out = append(out, rl)
		}
	}
	return out
}

// renewLater renews, at by, the attempts of later still registered then (those whose final
// write has not returned), on a goroutine of its own so that the rounds keep their ticks. A
// renewal that fails is tried once more a quarter of an interval on: the wait used up the
// time a failed renewal would otherwise have had until the next round.
func (rn *renewer) renewLater(later []*renewal, by time.Time) {
	g := rn.r.g
	g.wg.Add(1) // the loop's own count keeps the WaitGroup above zero meanwhile
	go func() {
		defer g.wg.Done()
		all := later
		defer func() {
			rn.mu.Lock()
			for _, rl := range all {
				rl.later = false
			}
			rn.mu.Unlock()
		}()
		for try := 0; try < 2; try++ {
			t := time.NewTimer(time.Until(by))
			select {
			case <-g.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			batch := rn.stillOwned(later)
			if len(batch) == 0 { // every write returned
				return
			}
			sent := mono(time.Now())
			rn.send(batch, false, "")
			later = nil
			for _, rl := range batch {
				if rl.notRenewedSince(sent) {
					later = append(later, rl)
				}
			}
			if len(later) == 0 {
				return
			}
			by = time.Now().Add(g.opts.HeartbeatInterval / 4)
		}
	}()
}

// due sorts the attempts registered for a round begun at now: those to renew now, and
// those whose final write is being made, to renew at by if it has not returned then (see
// renewer); gone are the tokens to say on the alive channel.
func (rn *renewer) due(now time.Time) (batch, later []*renewal, by time.Time, gone string) {
	opts := rn.r.g.opts
	by = now.Add(opts.HeartbeatInterval)
	rn.mu.Lock()
	defer rn.mu.Unlock()
	batch = make([]*renewal, 0, len(rn.owned))
	for rl := range rn.owned {
		if rl.later {
			continue // a renewLater goroutine renews it
		}
		if rn.expired(rl) {
			continue
		}
		// A renewal may wait until an interval of its lease is left, as it has when the
		// renewal before it failed; by then, or an interval on, a herd's final writes have
		// landed.
		if from := rl.o.leaseFrom.Load(); rl.o.finalPending.Load() && from != 0 {
			if d := monoStart.Add(time.Duration(from) + opts.LeaseTTL - opts.HeartbeatInterval); d.Sub(now) >= opts.HeartbeatInterval/4 {
				rl.later = true
				later = append(later, rl)
				if d.Before(by) {
					by = d
				}
				continue
			}
		}
		batch = append(batch, rl)
	}
	var say []string
	for token, until := range rn.gone {
		if until.After(now) {
			say = append(say, token)
		} else {
			delete(rn.gone, token)
		}
	}
	return batch, later, by, strings.Join(say, " ")
}

// stillOwned returns the attempts of rls still registered (their final write has not
// returned) and within their hard timeout.
func (rn *renewer) stillOwned(rls []*renewal) []*renewal {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	var out []*renewal
	for _, rl := range rls {
		if _, ok := rn.owned[rl]; ok && !rn.expired(rl) {
			out = append(out, rl)
		}
	}
	return out
}

// expired reports whether rl is past its hard timeout, and puts its token in rn.gone the
// first time: such an attempt is not renewed, and its followers must not take the
// instance's alive messages for it. rn.mu held.
func (rn *renewer) expired(rl *renewal) bool {
	if rl.ctx.Err() == nil {
		return false
	}
	if !rl.said {
		rl.said = true
		rn.sayGone(rl.o.token)
	}
	return true
}

// send renews batch, with the alive message saying gone when alive is set (with nothing to
// renew, the alive message alone).
func (rn *renewer) send(batch []*renewal, alive bool, gone string) {
	g := rn.r.g
	if len(batch) == 0 {
		rn.renew(nil, alive, gone)
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
			rn.renew(chunk, alive, said)
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

// renew sends one batch of renewals, and with alive the alive message.
func (rn *renewer) renew(batch []*renewal, alive bool, gone string) {
	r := rn.r
	g := r.g
	ctx, cancel := context.WithTimeout(g.ctx, writeTimeout(g))
	defer cancel()
	sent := mono(time.Now())
	cmds := rn.pipeline(ctx, batch, alive, gone)
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
		v, err := cmds[i].Int64()
		err = rl.o.renewed(sent, v, err)
		switch {
		case errors.Is(err, ErrLeaseLost):
			rl.cancel(ErrLeaseLost)
		case errors.Is(err, ErrFlightGone):
			// No lease left to renew: the call goes on for this process's callers, and
			// its followers elsewhere stop taking the alive messages for it.
			rn.mu.Lock()
			delete(rn.owned, rl)
			rn.sayGone(rl.o.token)
			rn.mu.Unlock()
			g.observe(Event{Kind: EventHeartbeatFailed, Key: rl.o.key, Err: err})
		case err != nil && rl.ctx.Err() == nil:
			g.observe(Event{Kind: EventHeartbeatFailed, Key: rl.o.key, Err: err})
		}
	}
}
