package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
	// redisTimeBy is a lower bound of Redis's clock (µs) at local time t; 0 if unknown.
	redisTimeBy(t time.Time) int64
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
	// answered: by when the local readers had the answer, a lower bound of Redis's clock
	// (µs; 0: after this write) and the Group's stamp of that moment (see answered.go)
	answered int64
	stamp    string
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
	tctx, cancelT := context.WithTimeoutCause(fctx, g.opts.Timeout, ErrTimeout)

	g.setOwned(f, true)
	f.startGen(RoleOwner, true)

	w := &Writer{g: g, f: f, o: o, ctx: fctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
	// The heartbeat lives under the hard timeout (a stuck owner function cannot keep the
	// lease), and on until the final write, so a slow final write does not let the lease
	// run out under it.
	stopHeartbeat := o.heartbeat(tctx, cancel)
	// What the attempt holds until its final write has landed: the lease, the contexts
	// (the heartbeat's among them: cancelled, it would stop renewing), and its place among
	// the owned flights (Close waits for them).
	release := func() {
		stopHeartbeat()
		g.setOwned(f, false)
		cancelT()
		cancel(nil)
	}
	detached := false // the final write goes on without the caller: it releases
	defer func() {
		if !detached {
			release()
		}
	}()

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
	defer func() {
		if !detached {
			wcancel()
		}
	}()
	if err == nil && cause != nil {
		err = cause
	}
	if err == nil && res.Outcome != Retry && res.Head.Status != 0 {
		ttl := g.resultTTL(res)
		store := res.Outcome == Store && ttl > 0
		fin := final{head: res.Head, store: store, ttl: ttl}
		fin.tail, fin.landedN, fin.skip = w.tail()
		fin.tail = append(fin.tail, res.Body...)
		if store { // the whole answer is put together only to be stored
			fin.transcript = w.transcript(res.Body)
			g.keepFor(f.key, fin.head, fin.transcript, 0, ttl) // kept here even if Redis is down
		}
		complete := func() {
			var cerr error
			write := func() { cerr = o.complete(wctx, fin) }
			if h := g.hooks.finalWrite; h != nil && o.remote() {
				h(f.key, write)
			} else {
				write()
			}
			stopHeartbeat()
			if cerr != nil && !errors.Is(cerr, ErrLeaseLost) {
				o.abandon() // the flight may look running with nobody renewing it
			}
			if errors.Is(cerr, ErrLeaseLost) {
				// Another owner took over; its result is the stored one. Our local
				// readers already hold a whole answer, so they get it rather than a
				// second call.
				g.observe(Event{Kind: EventFencedWrite, Key: f.key, Op: "complete"})
			}
		}
		now := time.Now()
		if us := o.redisTimeBy(now); us > 0 && w.wroteNothing() {
			fin.answered, fin.stamp = us, g.stamp(now)
			// A whole answer: no follower anywhere has a byte of it before the final
			// write. The local readers have it now, and the final write goes on
			// without them, fenced by the time they had it (see answered.go).
			f.finish(res.Head, res.Body)
			detached = true
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				defer release()
				defer wcancel()
				complete()
			}()
			// Let the final write go out before the caller answers its client: the
			// goroutine just made runs next on this P, sends, and waits for its reply
			// off the caller's path. Otherwise it waits for another P to be woken while
			// the answer goes out and the client's next requests come in, and the
			// followers elsewhere, who get the answer only once it lands, wait with it.
			runtime.Gosched()
			return attemptDone, res, nil
		}
		// Streamed bytes: the flight ends for its local readers once the final write is
		// done, not before, so that a request sent after the answer arrived never finds
		// that flight running.
		complete()
		f.finish(res.Head, res.Body)
		return attemptDone, res, nil
	}
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
	if ferr != nil && !errors.Is(ferr, ErrLeaseLost) {
		o.abandon()
	}
	if errors.Is(ferr, ErrLeaseLost) {
		g.observe(Event{Kind: EventFencedWrite, Key: f.key, Op: "fail"})
	}
	var lf *Result
	if res.Head.Status != 0 {
		lf = &res
	} else {
		lf = &Result{} // no response: the leader's reader gets ErrFailed
	}
	f.resetGen(lf)
	return attemptFailed, res, err
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
