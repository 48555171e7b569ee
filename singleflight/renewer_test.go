package singleflight

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// finalWriteHook holds an owner's final write until release is closed, and reports each
// renewal round sent meanwhile (a pipeline carrying the alive message): its number, and
// whether it renewed the flight.
type finalWriteHook struct {
	rn      func() *renewer
	meta    string
	held    chan int64 // the round under way when the final write was held
	release chan struct{}
	rounds  chan roundSeen
	once    sync.Once
}

type roundSeen struct {
	n       int64
	renewed bool
}

func (h *finalWriteHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *finalWriteHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 2 && a[0] == "evalsha" && a[1] == completeScript.Hash() && a[3] == h.meta {
			h.once.Do(func() {
				h.held <- h.rn().round.Load()
				<-h.release
			})
		}
		return next(ctx, cmd)
	}
}
func (h *finalWriteHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		alive, renewed := false, false
		for _, cmd := range cmds {
			a := cmd.Args()
			alive = alive || len(a) > 0 && a[0] == "publish"
			renewed = renewed || len(a) > 3 && a[0] == "evalsha" && a[1] == renewScript.Hash() && a[3] == h.meta
		}
		if alive {
			select {
			case h.rounds <- roundSeen{h.rn().round.Load(), renewed}:
			default:
			}
		}
		return next(ctx, cmds)
	}
}

// A lease whose final write is on its way is not renewed by the next round, and is by the
// rounds after it for as long as the write takes, so a slow final write never loses its
// lease; with a lease shorter than three intervals, every round renews it.
func TestRenewalPassesOverFinalWrite(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 150 * time.Millisecond
	for _, tc := range []struct {
		name     string
		lease    time.Duration
		passOver bool
	}{
		{"lease of 6 intervals", 6 * interval, true},
		{"lease of 2 intervals", 2 * interval, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uniqueKey()
			var a *Group
			hook := &finalWriteHook{rn: func() *renewer { return a.remote.renewer }, meta: "ai:flight:meta:{" + key + "}",
				held: make(chan int64, 1), release: make(chan struct{}), rounds: make(chan roundSeen, 100)}
			client := srv.Client()
			client.AddHook(hook)
			o := Options{HeartbeatInterval: interval, LeaseTTL: tc.lease}
			oa := o
			oa.Redis = client
			a = New(oa)
			t.Cleanup(func() { a.Close(context.Background()) })
			rec := newRecorder()
			ob := o
			ob.Observer = rec
			b := backend{redis: srv}.group(t, ob)

			rp := newReply("answer")
			ra, err := a.Do(key, false, rp.fn)
			if err != nil {
				t.Fatal(err)
			}
			waitCond(t, 10*time.Second, "a owns the flight", func() bool { return a.Owned() == 1 })
			waitB := doAll(t, b, key, 1, rp.fn)
			rec.waitFor(t, EventRole, 1, 10*time.Second)
			rp.release()
			heldIn := <-hook.held

			// Rounds heldIn+1 .. heldIn+3 while the final write is held.
			seen := map[int64]bool{}
			for len(seen) < 3 {
				select {
				case r := <-hook.rounds:
					if r.n > heldIn {
						seen[r.n] = r.renewed
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("renewal rounds seen after the final write was held: %v", seen)
				}
			}
			close(hook.release)
			if want := !tc.passOver; seen[heldIn+1] != want {
				t.Errorf("round after the final write was sent renewed it: %v, want %v", seen[heldIn+1], want)
			}
			for n := heldIn + 2; n <= heldIn+3; n++ {
				if !seen[n] {
					t.Errorf("round %d (final write still held) did not renew the lease", n-heldIn)
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if out := readAll(ctx, ra); out.err != nil || out.body != "answer" {
				t.Fatalf("owner's reader: %+v", out)
			}
			if out := waitB()[0]; out.err != nil || out.body != "answer" || out.role != RoleFollower {
				t.Fatalf("follower: %+v", out)
			}
			if n := rp.calls.Load(); n != 1 {
				t.Errorf("owner function ran %d times, want 1", n)
			}
			if n := rec.count(EventTakeover); n != 0 {
				t.Errorf("%d takeovers while the final write was held", n)
			}
		})
	}
}
