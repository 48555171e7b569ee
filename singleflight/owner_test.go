package singleflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// pausedPair is two instances on b's Redis, with a short lease: a's renewals are held
// until revive (a paused owner), and recA records a's events.
func pausedPair(t *testing.T, b backend) (a, other *Group, recA *recorder, revive func()) {
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, ResultTTL: time.Minute}
	recA = newRecorder()
	oa := o
	oa.Observer = recA
	a, other = b.group(t, oa), b.group(t, o)
	return a, other, recA, deadOwner(a)
}

func TestPausedOwnerIsFenced(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	for _, mode := range []string{"renew refused", "complete refused"} {
		t.Run(mode, func(t *testing.T) {
			a, bg, recA, revive := pausedPair(t, b)
			defer revive()
			key := uniqueKey()

			cause := make(chan error, 1)
			finishA := make(chan struct{})
			started := make(chan struct{}, 1)
			fnA := func(ctx context.Context, w *Writer) (Result, error) {
				started <- struct{}{}
				select {
				case <-ctx.Done():
					cause <- context.Cause(ctx)
					return Result{}, context.Cause(ctx)
				case <-finishA:
					return Result{Head: Head{Status: 200}, Body: []byte("stale")}, nil
				}
			}
			ra, _ := a.Do(key, false, fnA)
			defer ra.Close()
			<-started
			rpB := newReply("fresh")
			rpB.release()
			outs := doAll(t, bg, key, 3, rpB.fn)()
			for _, o := range outs {
				if o.body != "fresh" {
					t.Fatalf("B got %q; want fresh", o.body)
				}
			}
			if mode == "renew refused" {
				revive()
				if c := <-cause; !errors.Is(c, ErrLeaseLost) {
					t.Fatalf("old owner's cause %v; want ErrLeaseLost", c)
				}
				recA.waitFor(t, EventLeaseLost, 1, 5*time.Second)
			} else {
				close(finishA)
				recA.waitFor(t, EventFencedWrite, 1, 5*time.Second)
			}
			// The stored result is the new owner's.
			tok, err := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "token").Result()
			if err != nil {
				t.Fatalf("HGET token: %v", err)
			}
			body, _ := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Result()
			if body != "fresh" || !containsInstance(tok, bg.opts.InstanceID) {
				t.Fatalf("stored (%q, token %q); want (fresh, a token of instance %s)", body, tok, bg.opts.InstanceID)
			}
		})
	}
}

// TestPausedOwnerCancelsOnItsRefusedRenewal: an owner paused past its lease, whose flight
// another instance took over and still runs, has its renewal refused when it goes on (the
// flight runs under another token): it cancels its call with ErrLeaseLost, before its call
// wrote anything, and its caller follows the new owner.
func TestPausedOwnerCancelsOnItsRefusedRenewal(t *testing.T) {
	a, other, recA, revive := pausedPair(t, backend{name: "redis", redis: redistest.Start(t)})
	defer revive()
	key := uniqueKey()

	cause := make(chan error, 1)
	runningA := make(chan struct{}, 1)
	ra := mustDo(t, a, key, started(runningA, func(ctx context.Context, w *Writer) (Result, error) {
		<-ctx.Done() // it writes nothing until it is told to stop
		cause <- context.Cause(ctx)
		return Result{}, context.Cause(ctx)
	}))
	defer ra.Close()
	<-runningA
	rp := newReply("fresh")
	runningB := make(chan struct{}, 1)
	rb := mustDo(t, other, key, started(runningB, rp.fn))
	select {
	case <-runningB: // the lease ran out: other took over, and its call runs
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover within 10s")
	}

	revive()
	select {
	case c := <-cause:
		if !errors.Is(c, ErrLeaseLost) {
			t.Fatalf("the paused owner's call ended with %v; want ErrLeaseLost", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the paused owner's call still runs 5s after it went on; want it cancelled by its refused renewal")
	}
	recA.waitFor(t, EventLeaseLost, 1, 5*time.Second)
	if n := recA.count(EventFencedWrite); n != 0 {
		t.Fatalf("%d fenced writes of the paused owner; want none: its call wrote nothing", n)
	}

	rp.release()
	for name, r := range map[string]*Reader{"the paused owner's caller": ra, "the new owner's caller": rb} {
		if got := readWithin(r, 10*time.Second); got.err != nil || got.body != "fresh" {
			t.Fatalf("%s: %q %v; want the new owner's answer", name, got.body, got.err)
		}
	}
	if n := rp.calls.Load(); n != 1 {
		t.Fatalf("%d calls after the takeover; want 1", n)
	}
}

func containsInstance(token, id string) bool {
	return strings.Contains(token, "-"+id+"-")
}

// A complete refused at the end still serves the owner's local readers: they hold a whole
// answer (doc.go, "Owner suicide"). So does a refused final flush of the bytes still pending
// as the owner function returned: the Writer's ErrLeaseLost then must not make own()
// abandon the generation under a local reader that has bytes of it (ErrGenerationChanged,
// although its upstream call returned the whole answer). Whether a reader is served must
// not depend on whether the last write was still waiting for its batch.
//
// Interleaving: the owner streams "A" (appended at once) and "B" (waiting for the batch
// delay); its renewals stall; its lease runs out and another instance takes over; the
// owner function then returns; the final flush of "B" is fenced.
func TestFencedFinalFlushStillServesLocalReaders(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, BatchDelay: 3 * time.Second}
	oa := o
	appended := &replied{match: scriptCalls(appendScript), ch: make(chan struct{}, 8)}
	oa.Redis = srv.Client()
	oa.Redis.AddHook(appended)
	a, c := backend{}.group(t, oa), b.group(t, o)
	stall := make(chan struct{})
	a.hooks.beforeRenew = func(ctx context.Context) {
		select {
		case <-stall:
		case <-ctx.Done():
		}
	}
	defer close(stall)
	key := uniqueKey()
	wrote, proceed := make(chan struct{}), make(chan struct{})
	ra, _ := a.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		_, _ = w.Write([]byte("A"))
		select { // "A" is appended alone, at once
		case <-appended.ch:
		case <-time.After(5 * time.Second):
			return Result{}, errors.New("the append of \"A\" was not answered within 5s")
		}
		_, _ = w.Write([]byte("B")) // waits for the batch
		close(wrote)
		<-proceed
		return Result{Outcome: Share}, nil
	})
	<-wrote
	owner := readStream(context.Background(), ra)
	<-owner.first

	// Another instance follows, and takes over once a's lease ran out (its reader has
	// delivered nothing, so it can use a new attempt).
	took := make(chan struct{})
	second := newReply("second")
	defer second.release()
	rc, _ := c.Do(key, false, started(took, second.fn))
	defer rc.Close()
	select {
	case <-took:
	case <-time.After(3 * time.Second):
		t.Fatal("no takeover within 3s")
	}
	close(proceed) // the owner function returns its whole answer; the flush of "B" is fenced
	select {
	case out := <-owner.done:
		if out.err != nil || out.body != "AB" {
			t.Fatalf("owner's reader got (%q, %v); want the whole answer it was streaming, (\"AB\", nil)", out.body, out.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("owner's reader still waiting after 3s")
	}
}

func TestZombieOwnerHardTimeout(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{Timeout: 100 * time.Millisecond, MaxAttempts: 3})
			key := uniqueKey()
			var causes []error
			calls := 0
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				calls++
				<-ctx.Done() // hangs until the flight context ends it
				causes = append(causes, context.Cause(ctx))
				return Result{}, context.Cause(ctx)
			}
			outs := doAll(t, g, key, 4, fn)()
			for i, o := range outs {
				if !errors.Is(o.err, ErrFailed) {
					t.Fatalf("caller %d: err %v; want ErrFailed", i, o.err)
				}
			}
			if calls != 3 {
				t.Fatalf("%d calls; want MaxAttempts = 3", calls)
			}
			for _, c := range causes {
				if !errors.Is(c, ErrTimeout) {
					t.Fatalf("cause %v; want ErrTimeout", c)
				}
			}
		})
	}
}
