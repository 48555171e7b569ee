package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestHundredCallersOneCall(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			rp := newReply(`{"n":1}`)
			wait := doAll(t, g, key, 100, rp.fn)
			rp.release()
			outs := wait()
			if got := rp.calls.Load(); got != 1 {
				t.Fatalf("owner function ran %d times; want 1", got)
			}
			for i, o := range outs {
				if o.err != nil || o.body != `{"n":1}` || o.head.Status != 200 {
					t.Fatalf("caller %d: got (%d, %q, %v); want (200, %q, nil)", i, o.head.Status, o.body, o.err, `{"n":1}`)
				}
			}
			roles := countRoles(outs)
			if roles[RoleOwner] != 1 || roles[RoleFollower] != 99 {
				t.Fatalf("roles %v; want 1 owner and 99 followers", roles)
			}
			if outs[0].role != RoleOwner {
				t.Fatalf("the first caller's role is %v; want owner", outs[0].role)
			}

			// A repeat is served from the stored result.
			again := doAll(t, g, key, 1, rp.fn)()[0]
			if again.role != RoleHit || again.body != `{"n":1}` || rp.calls.Load() != 1 {
				t.Fatalf("repeat: role %v body %q calls %d; want hit, same body, 1 call", again.role, again.body, rp.calls.Load())
			}
		})
	}
}

func TestDistinctKeysIndependent(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{})
			var waits []func() []outcome
			var replies []*reply
			for i := range 10 {
				rp := newReply(fmt.Sprintf("body-%d", i))
				replies = append(replies, rp)
				waits = append(waits, doAll(t, g, uniqueKey(), 10, rp.fn))
			}
			// Release in reverse: no key waits for another.
			for i := len(replies) - 1; i >= 0; i-- {
				replies[i].release()
				for _, o := range waits[i]() {
					if o.err != nil || o.body != fmt.Sprintf("body-%d", i) {
						t.Fatalf("key %d: got (%q, %v); want body-%d", i, o.body, o.err, i)
					}
				}
				if c := replies[i].calls.Load(); c != 1 {
					t.Fatalf("key %d: %d calls; want 1", i, c)
				}
			}
		})
	}
}

func TestNoCacheSkipsStoredResult(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			rp := newReply("x")
			rp.release()
			doAll(t, g, key, 1, rp.fn)()
			r, _ := g.Do(key, true, rp.fn)
			o := readAll(context.Background(), r)
			if o.role != RoleOwner || rp.calls.Load() != 2 {
				t.Fatalf("no-cache: role %v, calls %d; want owner, 2", o.role, rp.calls.Load())
			}
		})
	}
}

func TestDedupeOnlyStoresNothing(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{}) // ResultTTL 0
			key := uniqueKey()
			rp := newReply("x")
			rp.release()
			doAll(t, g, key, 1, rp.fn)()
			o := doAll(t, g, key, 1, rp.fn)()[0]
			if o.role != RoleOwner || rp.calls.Load() != 2 {
				t.Fatalf("after the flight: role %v, calls %d; want owner, 2", o.role, rp.calls.Load())
			}
		})
	}
}

func TestShareOutcomeNotStored(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			gate := make(chan struct{})
			calls := 0
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				calls++
				<-gate
				return Result{Head: Head{Status: 400}, Body: []byte("bad"), Outcome: Share}, nil
			}
			wait := doAll(t, g, key, 5, fn)
			close(gate)
			for _, o := range wait() {
				if o.head.Status != 400 || o.body != "bad" {
					t.Fatalf("got (%d, %q); want (400, bad)", o.head.Status, o.body)
				}
			}
			gate = make(chan struct{})
			close(gate)
			if o := doAll(t, g, key, 1, fn)()[0]; o.role != RoleOwner || calls != 2 {
				t.Fatalf("after a shared 400: role %v calls %d; want owner, 2 (not stored)", o.role, calls)
			}
		})
	}
}

func TestPanicReleasesWaiters(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			o := Options{MaxAttempts: 2}
			g := b.group(t, o)
			key := uniqueKey()
			gate := make(chan struct{})
			running := make(chan struct{}, 10)
			fn := started(running, func(ctx context.Context, w *Writer) (Result, error) {
				<-gate
				panic("owner bug")
			})
			waits := []func() []outcome{doAll(t, g, key, 3, fn)}
			<-running
			if b.redis != nil { // a remote follower too
				g2 := b.group(t, o)
				waits = append(waits, doAll(t, g2, key, 3, fn))
			}
			close(gate)
			for _, w := range waits {
				for i, o := range w() {
					if !errors.Is(o.err, ErrFailed) {
						t.Fatalf("caller %d: err %v; want ErrFailed", i, o.err)
					}
				}
			}
		})
	}
}

// TestInlineCallerLeadsOnItsGoroutine: a caller with CallOptions.Inline that starts a
// flight runs its owner function on its own goroutine (DoWith returns with the flight
// over); a caller joining meanwhile gets the same answer, from one call.
func TestInlineCallerLeadsOnItsGoroutine(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{})
			key := uniqueKey()
			rp := newReply("answer")
			running := make(chan struct{}, 1)
			var onCaller atomic.Bool
			fn := started(running, func(ctx context.Context, w *Writer) (Result, error) {
				buf := make([]byte, 64<<10)
				// A frame of DoWith below it, not just "created by" DoWith.
				onCaller.Store(strings.Contains(string(buf[:runtime.Stack(buf, false)]), "(*Group).DoWith("))
				return rp.fn(ctx, w)
			})
			led := doAsync(t, g, key, CallOptions{Inline: true}, fn)
			<-running
			joiner, err := g.Do(key, false, rp.fn)
			if err != nil {
				t.Fatal(err)
			}
			rp.release()
			ctx := context.Background()
			if out := readAll(ctx, <-led); out.err != nil || out.body != "answer" || out.role != RoleOwner {
				t.Fatalf("inline caller: %+v; want the answer as its owner", out)
			}
			if out := readAll(ctx, joiner); out.err != nil || out.body != "answer" || out.role != RoleFollower {
				t.Fatalf("joiner: %+v; want the answer as a follower", out)
			}
			if !onCaller.Load() {
				t.Error("the owner function ran on a goroutine of its own, not the caller's")
			}
			if n := rp.calls.Load(); n != 1 {
				t.Errorf("%d calls; want 1", n)
			}
		})
	}
}

// Closing an instance while Redis is down ends within its context and one write: an owner
// released at shutdown does not make its final write again.
func TestCloseDuringAnOutageDoesNotWaitOutTheLease(t *testing.T) {
	srv := redistest.Start(t)
	g := New(Options{Redis: productClient(t, srv)}) // a lease of 3 s
	running := make(chan struct{}, 1)
	r, err := g.Do(uniqueKey(), false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-ctx.Done()
		return Result{}, context.Cause(ctx)
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	<-running
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = g.Close(ctx)
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("Close took %v with a context of 100 ms while Redis was down; want no wait for the lease (3 s)", d)
	}
}
