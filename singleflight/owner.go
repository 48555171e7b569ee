package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// ownership is what an owner needs from its coordinator: the fenced writes of one attempt.
// Every method answers ErrLeaseLost when the attempt's token is no longer the flight's.
type ownership interface {
	// heartbeat keeps the attempt's lease while ctx lasts, until stop is called; a refused
	// renewal calls cancel with ErrLeaseLost.
	heartbeat(ctx context.Context, cancel context.CancelCauseFunc) (stop func())
	// appendBatch adds batch number n (from 1) of streamed bytes; head rides on the first.
	appendBatch(ctx context.Context, n int, head *Head, data []byte) error
	// complete ends the flight with its answer; see final.
	complete(ctx context.Context, fin final) error
	// fail ends this attempt; res is the failed answer, if there is one.
	fail(ctx context.Context, res Result, reason string) error
	// remote says whether there are followers elsewhere to renew and write for.
	remote() bool
	// abandon tells followers elsewhere that the attempt ended although its final write
	// failed: they look the flight up instead of waiting for its lease on the owner's word.
	abandon()
}

// final is what complete writes: the head, the bytes followers have not surely been sent
// (tail: a batch whose append may or may not have landed, landedN and skip as in
// Writer.tail, then unsent bytes and the body), and the whole answer for storing.
type final struct {
	head       Head
	tail       []byte
	landedN    int
	skip       int
	transcript []byte
	store      bool
	ttl        time.Duration // of the stored answer
}

// attemptEnd is how one owned attempt ended.
type attemptEnd uint8

const (
	attemptDone      attemptEnd = iota // the flight has its response
	attemptFailed                      // Retry outcome, error or panic
	attemptLeaseLost                   // another owner took over
)

// own runs f's owner function as one attempt under o and publishes what it produces.
func (g *Group) own(ctx context.Context, f *flight, o ownership) (attemptEnd, Result, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tctx, cancelT := context.WithTimeoutCause(fctx, g.opts.Timeout, ErrTimeout)
	defer cancelT()

	g.setOwned(f, true)
	defer g.setOwned(f, false)
	f.startGen(RoleOwner, true)

	w := &Writer{g: g, f: f, o: o, ctx: fctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
	// The heartbeat lives under the hard timeout (a stuck owner function cannot keep the
	// lease), and on until the final write, so a slow final write does not let the lease
	// run out under it.
	stopHeartbeat := o.heartbeat(tctx, cancel)
	defer stopHeartbeat()

	res, err := callOwner(tctx, f.fn, w)
	// An answer the function returned before anything ended its context is whole: its
	// local readers get it even if the final flush or write is fenced (another owner's
	// answer is then the stored one), as they do when only complete is refused.
	whole := err == nil && res.Outcome != Retry && context.Cause(tctx) == nil
	w.closeAndFlush()
	w.flusher.Wait()

	cause := context.Cause(tctx)
	if whole {
		cause = nil
	}
	if cause != nil && errors.Is(cause, ErrLeaseLost) || !whole && errors.Is(w.err, ErrLeaseLost) {
		g.observe(Event{Kind: EventLeaseLost, Key: f.key})
		f.resetGen(nil)
		return attemptLeaseLost, res, ErrLeaseLost
	}
	if res.Head.Status == 0 && w.head != nil {
		res.Head = *w.head
	}
	// The write below must happen even when the flight context ended (timeout, shutdown).
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout(g))
	defer wcancel()
	if err == nil && cause != nil {
		err = cause
	}
	if err == nil && res.Outcome != Retry && res.Head.Status != 0 {
		g.completeAttempt(wctx, f, o, w, res, stopHeartbeat)
		return attemptDone, res, nil
	}
	return attemptFailed, res, g.failAttempt(wctx, f, o, res, err, cause, stopHeartbeat)
}

// completeAttempt makes an attempt's final write of a whole answer, then ends f with it.
func (g *Group) completeAttempt(wctx context.Context, f *flight, o ownership, w *Writer, res Result, stopHeartbeat func()) {
	ttl := g.resultTTL(res)
	store := res.Outcome == Store && ttl > 0
	fin := final{head: res.Head, store: store, ttl: ttl}
	fin.tail, fin.landedN, fin.skip = w.tail()
	fin.tail = append(fin.tail, res.Body...)
	if store { // the whole answer is put together only to be stored
		fin.transcript = w.transcript(res.Body)
		g.keepFor(f.key, fin.head, fin.transcript, 0, ttl) // kept here even if Redis is down
	}
	// The flight ends for its local readers once the final write is done, not before:
	// a request sent after an answer arrived must never find that flight running.
	sent := time.Now()
	cerr := o.complete(wctx, fin)
	if g.hooks.completed != nil {
		g.hooks.completed()
	}
	stopHeartbeat()
	// Refused (another owner took over, and its result is the stored one, or Redis
	// lost the flight), our local readers still get the whole answer they hold
	// rather than a second call.
	g.writeEnded(o, f.key, "complete", cerr)
	// A caller that joined once the write was on its way may have been sent by a
	// client answered elsewhere: it is not given the answer (answered.go). So may one
	// that joined while an unanswered write was made again: it may have landed.
	if o.remote() && !errors.Is(cerr, ErrLeaseLost) && !errors.Is(cerr, ErrFlightGone) {
		f.fenceAt(sent)
	}
	f.finish(res.Head, res.Body)
}

// failAttempt makes the final write of a failed attempt, and returns why it failed.
func (g *Group) failAttempt(wctx context.Context, f *flight, o ownership, res Result, err, cause error, stopHeartbeat func()) error {
	if err == nil {
		err = fmt.Errorf("%w: no response", ErrFailed)
		if res.Outcome == Retry && res.Head.Status != 0 {
			err = fmt.Errorf("%w: upstream status %d", ErrFailed, res.Head.Status)
		}
	}
	reason := "error"
	if errors.Is(err, ErrShutdown) || errors.Is(cause, ErrShutdown) {
		reason = "shutdown"
	} else if errors.Is(cause, ErrTimeout) {
		reason = "timeout"
	}
	ferr := o.fail(wctx, res, reason)
	stopHeartbeat()
	g.writeEnded(o, f.key, "fail", ferr)
	var lf *Result
	if res.Head.Status != 0 {
		lf = &res
	} else {
		lf = &Result{} // no response: the leader's reader gets ErrFailed
	}
	f.resetGen(lf)
	return err
}

// writeEnded acts on how an owner's write op ended, err being the final write's error or
// an append's refusal. A refused write (another owner holds the flight: ErrLeaseLost, or
// Redis lost it: ErrFlightGone) is an event. After any other failure of a final write, or
// when Redis lost the flight, it may look running with nobody renewing it: the alive
// messages say its token gone.
func (g *Group) writeEnded(o ownership, key, op string, err error) {
	if err == nil {
		return
	}
	if !errors.Is(err, ErrLeaseLost) {
		o.abandon()
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		g.observe(Event{Kind: EventFencedWrite, Key: key, Op: op})
	case errors.Is(err, ErrFlightGone):
		g.observe(Event{Kind: EventFencedWrite, Key: key, Op: op, Err: ErrFlightGone})
	}
}

func writeTimeout(g *Group) time.Duration {
	if g.opts.LeaseTTL > time.Second {
		return g.opts.LeaseTTL
	}
	return time.Second
}

// callOwner runs fn, turning a panic into an error so that no waiter is left hanging.
func callOwner(ctx context.Context, fn Func, w *Writer) (res Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			res = Result{}
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return fn(ctx, w)
}
