package singleflight

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/wake"
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
	// unrenewed: tokens whose last renewal failed, said as such until one lands (ADR 0057).
	unrenewed map[string]struct{}
	// busy: shards whose pipeline of a round is still out; the rounds skip them (ADR 0081).
	busy    map[string]bool
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
	return &renewer{r: r, owned: map[*renewal]struct{}{}, gone: map[string]time.Time{}, unrenewed: map[string]struct{}{},
		busy: map[string]bool{}}
}

// unwritten has the alive messages say token gone: its final write failed (ADR 0009).
func (rn *renewer) unwritten(token string) {
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
		delete(rn.unrenewed, o.token)
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
		batch, later, by := rn.due(begun)
		if len(later) > 0 {
			rn.renewLater(later, by) // before this round's renewals, which may be slow
		}
		rn.sendRound(batch, begun, len(later) > 0)
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
			rn.sendShards(batch)
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

// due sorts a round's attempts: to renew now, or at by.
func (rn *renewer) due(now time.Time) (batch, later []*renewal, by time.Time) {
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
	return batch, later, by
}

// said is what a round's alive message says: the tokens unrenewed, and those gone until
// their time.
func (rn *renewer) said(now time.Time) string {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	var say []string
	for token := range rn.unrenewed {
		say = append(say, wake.UnrenewedMark+token)
	}
	for token, until := range rn.gone {
		if until.After(now) {
			say = append(say, token)
		} else {
			delete(rn.gone, token)
		}
	}
	return strings.Join(say, " ")
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
