package singleflight

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/wake"
	"github.com/redis/go-redis/v9"
)

// renewer renews every lease this process owns each HeartbeatInterval, then publishes the
// alive message (ADR 0007); late, a lease whose final write is pending or failed (ADR 0008).
type renewer struct {
	r *remote

	round atomic.Int64 // renewal rounds begun

	mu    sync.Mutex
	owned map[*renewal]struct{}
	// gone: tokens stopped without a final write, said until their time (ADR 0011).
	gone map[string]time.Time
	// stale: tokens whose last renewal failed, said as such until one lands (ADR 0057).
	stale   map[string]struct{}
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
	later  bool                    // a renewLater goroutine renews it, not the rounds; rn.mu
}

// notRenewedSince reports whether rl, within its hard timeout, got no lease since t (mono).
func (rl *renewal) notRenewedSince(t int64) bool {
	return rl.ctx.Err() == nil && rl.o.leaseFrom.Load() < t
}

func newRenewer(r *remote) *renewer {
	return &renewer{r: r, owned: map[*renewal]struct{}{}, gone: map[string]time.Time{}, stale: map[string]struct{}{}}
}

// abandon has the alive messages say token gone: its final write failed (ADR 0009).
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
		// The caller is counted by the Group's WaitGroup: adding to it is safe.
		rn.started = true
		rn.r.g.wg.Add(1)
		go rn.loop()
	}
	rn.mu.Unlock()
	return sync.OnceFunc(func() {
		rn.mu.Lock()
		delete(rn.owned, rl)
		delete(rn.stale, o.token)
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
			rn.renewLater(later, by) // before this round's renewals, which may be slow
		}
		if len(batch) > 0 || gone != "" || len(later) > 0 {
			rn.send(batch, true, gone) // the alive message goes every round
		}
		// Failed renewals are tried a quarter and a half interval on (ADR 0008).
		if failed := rn.notRenewed(batch, mono(begun)); len(failed) > 0 {
			rn.renewLater(failed, time.Now().Add(g.opts.HeartbeatInterval/4))
		}
	}
}

// notRenewed marks for renewLater the attempts of batch not renewed since begun (mono).
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

// renewLater renews later's attempts still registered at by, on a goroutine of its own so
// that the rounds keep their ticks; a failure is tried again a quarter interval on.
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

// due sorts a round's attempts: to renew now, or at by; and the tokens to say gone.
func (rn *renewer) due(now time.Time) (batch, later []*renewal, by time.Time, gone string) {
	opts := rn.r.g.opts
	by = now.Add(opts.HeartbeatInterval)
	rn.mu.Lock()
	defer rn.mu.Unlock()
	batch = make([]*renewal, 0, len(rn.owned))
	for rl := range rn.owned {
		if rl.later || rl.o.cutIn.Load() {
			continue // a renewLater goroutine renews it, or it was cut
		}
		if rn.expired(rl) {
			continue
		}
		// Renewed late, when an interval of its lease is left (ADR 0008).
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
	for token := range rn.stale {
		say = append(say, wake.StaleMark+token)
	}
	for token, until := range rn.gone {
		if until.After(now) {
			say = append(say, token)
		} else {
			delete(rn.gone, token)
		}
	}
	return batch, later, by, strings.Join(say, " ")
}

// stillOwned returns the attempts of rls still registered and within their hard timeout.
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

// expired reports whether rl is past its hard timeout, and says its token gone; rn.mu held.
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

func (rn *renewer) pipeline(ctx context.Context, batch []*renewal, alive bool, gone string) []*redis.Cmd {
	r := rn.r
	cmds := make([]*redis.Cmd, len(batch))
	_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, rl := range batch {
			cmds[i] = rl.o.renewCmd(ctx, p)
		}
		if alive {
			p.Publish(ctx, r.wake.AliveChannel(r.g.opts.InstanceID), gone)
		}
		return nil
	})
	return cmds
}

// renew sends batch's renewals in one pipeline, then with alive the alive message.
func (rn *renewer) renew(batch []*renewal, alive bool, gone string) {
	r := rn.r
	g := r.g
	ctx, cancel := context.WithTimeout(g.ctx, max(g.opts.LeaseTTL, time.Second)) // off the callers' path
	defer cancel()
	sent := mono(time.Now())
	cmds := rn.pipeline(ctx, batch, alive, gone)
	// A Redis that lost its scripts answers NOSCRIPT: load the script once, send again.
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
			// The load failed on some node: each renewal alone sends the script.
			for _, i := range again {
				cmds[i] = batch[i].o.renewRun(ctx)
			}
		}
	}
	for i, rl := range batch {
		v, err := cmds[i].Int64()
		if err == nil && v == cutRenew || rl.o.cutIn.Load() {
			rl.o.cutLearned() // by this renewal, or by a reply that told of it meanwhile (ADR 0074)
			continue
		}
		err = rl.o.renewed(sent, v, err)
		rn.mu.Lock()
		_, owned := rn.owned[rl] // not stopped meanwhile
		if owned && err != nil && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrFlightGone) && rl.ctx.Err() == nil {
			rn.stale[rl.o.token] = struct{}{}
		} else {
			delete(rn.stale, rl.o.token)
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
}
