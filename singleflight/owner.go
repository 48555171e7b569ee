package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// ownership is what an owner needs from its coordinator: the fenced writes of one attempt.
// A write that Redis refuses because the attempt's token is no longer the flight's answers
// ErrLeaseLost (a heartbeat cancels the call with it).
type ownership interface {
	// heartbeat keeps the lease while ctx lasts, until stop; a refusal cancels the call.
	heartbeat(ctx context.Context, cancel context.CancelCauseFunc) (stop func())
	// appendBatch adds batch number n (from 1) of streamed bytes; head rides on the first.
	appendBatch(ctx context.Context, n int, head *Head, data []byte) error
	// complete ends the flight with its answer, fail this attempt (res: its failed answer,
	// if any). Each makes its write once, within one Redis deadline (none while the
	// flight's shard is degraded); goesOn then says whether it is to be made again, which
	// again does while Redis does not answer and the lease runs, or, while the shard is
	// degraded, a linger past it (ADRs 0024, 0056, 0060).
	complete(ctx context.Context, fin final) error
	fail(ctx context.Context, res Result, reason string) error
	goesOn() bool
	again(ctx context.Context) error
	// unusable says whether the flight's shard is degraded or suspected: no caller waits
	// on its writes.
	unusable() bool
	// shared says whether the attempt's writes reach callers elsewhere: not in memory or
	// local-only, nor once Redis cut it.
	shared() bool
	// unwritten tells followers elsewhere that the attempt ended without its final write:
	// the alive messages name its token gone (ADR 0009).
	unwritten()
	// cut ends the flight for a call nobody waits for, if its coordinator sees no caller
	// waiting anywhere; false leaves the call running (ADR 0074).
	cut(ctx context.Context) bool
}

// final is what complete writes; tail, landedN and skip are as in Writer.tail.
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
	attemptAbandoned                   // no caller waited: the call was cut (ADR 0074)
)

// own runs f's owner function as one attempt under o and publishes what it produces.
func (g *Group) own(ctx context.Context, f *flight, o ownership) (attemptEnd, Result, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	tctx, cancelT := context.WithTimeoutCause(fctx, g.opts.Timeout, ErrTimeout)

	g.setOwned(f, true)
	defer g.setOwned(f, false)
	f.startGen(RoleOwner, true)

	w := &Writer{g: g, f: f, o: o, ctx: fctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
	g.ownedBy(f, &ownedAttempt{o: o, cancel: cancel}, false)
	// Under the hard timeout, and on until the final write (ADRs 0007, 0008): end ends the
	// attempt, here or after a final write that goes on past this call (ADR 0056).
	stopHeartbeat := o.heartbeat(tctx, cancel)
	ended, handed := false, false
	end := func() {
		if !ended {
			ended = true
			stopHeartbeat()
			cancelT()
			cancel(nil)
		}
	}
	defer func() {
		if !handed {
			end()
		}
	}()

	res, err := callOwner(tctx, f.fn, w)
	// An answer the function returned without an error is whole, whatever ended its context
	// meanwhile: its local readers get it even if its final write is fenced (ADR 0027), and
	// a cut that landed as it returned does not throw it away: the final write decides
	// (ADR 0074).
	whole := err == nil && res.Outcome != Retry
	g.ownedBy(f, nil, !whole && errors.Is(context.Cause(fctx), ErrAbandoned))
	w.closeAndFlush()
	w.flusher.Wait()

	cause := context.Cause(tctx)
	if whole {
		cause = nil
	}
	if errors.Is(cause, ErrAbandoned) {
		// Cut: the flight has ended in Redis already, and nobody here waits (ADR 0074).
		f.resetGen(nil)
		return attemptAbandoned, res, ErrAbandoned
	}
	if cause != nil && errors.Is(cause, ErrLeaseLost) || !whole && errors.Is(w.err, ErrLeaseLost) {
		g.observe(Event{Kind: EventLeaseLost, Key: f.key})
		f.resetGen(nil)
		return attemptLeaseLost, res, ErrLeaseLost
	}
	if res.Head.Status == 0 && w.head != nil {
		res.Head = *w.head
	}
	// The final write is made even when the flight context ended.
	wctx := context.WithoutCancel(ctx)
	if err == nil && cause != nil {
		err = cause
	}
	if err == nil && res.Outcome != Retry && res.Head.Status != 0 {
		handed = g.completeAttempt(wctx, f, o, w, res, end)
		return attemptDone, res, nil
	}
	handed, err = g.failAttempt(wctx, f, o, res, err, cause, end)
	return attemptFailed, res, err
}

// goOn makes a final write again, after its caller was answered, while Redis does not
// answer and the lease runs, then ends the attempt and acts on how the write ended. A
// closing Group stops its retries.
func (g *Group) goOn(o ownership, key, op string, end func(), ended func(error)) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := o.again(g.ctx)
		end()
		ended(err)
	}()
}

// completeAttempt makes an attempt's final write of a whole answer, then ends f with it;
// handed says the write goes on after it (goOn).
func (g *Group) completeAttempt(wctx context.Context, f *flight, o ownership, w *Writer, res Result, end func()) (handed bool) {
	ttl := g.resultTTL(res)
	store := res.Outcome == Store && ttl > 0
	fin := final{head: res.Head, store: store, ttl: ttl}
	fin.tail, fin.landedN, fin.skip = w.tail()
	fin.tail = append(fin.tail, res.Body...)
	if store {
		fin.transcript = w.transcript(res.Body)
		g.keepFor(f.key, fin.head, fin.transcript, 0, ttl) // kept here even if Redis is down
	}
	// The flight ends here only once the final write is done (ADR 0020).
	sent := time.Now()
	cerr := o.complete(wctx, fin)
	if g.hooks.completed != nil {
		g.hooks.completed()
	}
	// Refused, the write still leaves the local readers their whole answer (ADR 0027), but
	// not later callers: the flight's answer is another owner's.
	ended := func(err error) {
		g.writeEnded(o, f.key, "complete", err)
		if store && errors.Is(err, ErrLeaseLost) {
			g.forgetKept(f.key, fin.transcript)
		}
	}
	// Redis did not answer within one deadline: the callers here are answered now, the
	// write goes on, and a caller that joins from now on looks again (ADRs 0021, 0056).
	if handed = o.goesOn(); !handed {
		end()
		ended(cerr)
	}
	// Gated unless refused: a write whose reply was lost may have landed (ADR 0021).
	if o.shared() && !errors.Is(cerr, ErrLeaseLost) && !errors.Is(cerr, ErrFlightGone) {
		f.setLandedAt(sent)
	}
	f.finish(res.Head, res.Body)
	if handed {
		g.goOn(o, f.key, "complete", end, ended)
	}
	return handed
}

// failAttempt makes the final write of a failed attempt, and returns why it failed;
// handed says the write goes on after it (goOn).
func (g *Group) failAttempt(wctx context.Context, f *flight, o ownership, res Result, err, cause error, end func()) (handed bool, _ error) {
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
	if handed = o.goesOn(); handed {
		g.goOn(o, f.key, "fail", end, func(err error) { g.writeEnded(o, f.key, "fail", err) })
	} else {
		end()
		g.writeEnded(o, f.key, "fail", ferr)
	}
	var lf *Result
	if res.Head.Status != 0 {
		lf = &res
	} else {
		lf = &Result{} // no response: the starter's reader gets ErrFailed
	}
	f.resetGen(lf)
	return handed, err
}

// writeEnded acts on a final write's error or an append's refusal (ADRs 0009, 0011).
func (g *Group) writeEnded(o ownership, key, op string, err error) {
	if err == nil {
		return
	}
	if !errors.Is(err, ErrLeaseLost) {
		o.unwritten()
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		g.observe(Event{Kind: EventFencedWrite, Key: key, Op: op})
	case errors.Is(err, ErrFlightGone):
		g.observe(Event{Kind: EventFencedWrite, Key: key, Op: op, Err: ErrFlightGone})
	}
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
