package singleflight

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// finalWriteHook holds every final write (complete) until release is closed, saying whose
// it holds, then sends it whatever its deadline; and reports each renewal pipeline (one
// carrying the alive message): the round under way, and the flights it renewed.
type finalWriteHook struct {
	rn      func() *renewer
	held    chan string // the meta key of each final write held
	release chan struct{}
	rounds  chan roundSeen
}

type roundSeen struct {
	n       int64    // the round under way
	start   bool     // a round's start (it carries the alive message), or a renewal made later
	renewed []string // meta keys
}

func (h *finalWriteHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *finalWriteHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 3 && a[0] == "evalsha" && a[1] == completeScript.Hash() {
			h.held <- a[3].(string)
			<-h.release
			return next(context.WithoutCancel(ctx), cmd)
		}
		return next(ctx, cmd)
	}
}
func (h *finalWriteHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		seen := roundSeen{}
		for _, cmd := range cmds {
			a := cmd.Args()
			seen.start = seen.start || len(a) > 0 && a[0] == "publish"
			if len(a) > 3 && a[0] == "evalsha" && a[1] == renewScript.Hash() {
				seen.renewed = append(seen.renewed, a[3].(string))
			}
		}
		if seen.start || len(seen.renewed) > 0 { // the renewer's: it exists
			seen.n = h.rn().round.Load()
			select {
			case h.rounds <- seen:
			default:
			}
		}
		return next(ctx, cmds)
	}
}

// While an owner's final write is being made (here held for longer than a lease), its lease
// is renewed later than the round's start, when an interval of it is left; so a new caller
// that comes after the lease would have run out follows the flight instead of taking it
// over, and the upstream is called once.
func TestRenewalWhileFinalWriteIsMade(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 50 * time.Millisecond
	const lease = 10 * interval
	key := uniqueKey()
	meta := "ai:flight:meta:{" + key + "}"
	var a *Group
	hook := &finalWriteHook{rn: func() *renewer { return a.remote.renewer }, held: make(chan string, 1), release: make(chan struct{}), rounds: make(chan roundSeen, 1000)}
	client := srv.Client()
	client.AddHook(hook)
	o := Options{HeartbeatInterval: interval, LeaseTTL: lease}
	oa := o
	oa.Redis = client
	a = New(oa)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.Close(ctx)
	})
	rec := newRecorder()
	oc := o
	oc.Observer = rec
	c := backend{redis: srv}.group(t, oc)
	rp := newReply("answer")
	answer := sync.OnceFunc(rp.release)
	unblock := sync.OnceFunc(func() { close(hook.release) })
	t.Cleanup(func() { unblock(); answer() }) // before a and c are closed, whatever failed

	ra, err := a.Do(key, false, rp.fn)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "a owns the flight", func() bool { return a.Owned() == 1 })
	answer()
	select {
	case <-hook.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the final write was never made")
	}

	heldIn := a.remote.renewer.round.Load() // a round begun before may still renew it

	// Twelve renewals since the write was held: longer than a lease.
	later, started := 0, 0
	deadline := time.After(10 * time.Second)
	for later < 12 {
		select {
		case r := <-hook.rounds:
			switch {
			case r.n <= heldIn:
			case r.start && slices.Contains(r.renewed, meta):
				t.Fatalf("a round renewed at its start a lease whose final write is being made (%d rounds after the write)", started)
			case r.start:
				started++
			case slices.Contains(r.renewed, meta):
				later++
			}
		case <-deadline:
			t.Fatalf("renewals of the lease after the final write was held: %d of 12 (%d rounds)", later, started)
		}
	}
	rc, err := c.Do(key, false, rp.fn)
	if err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, EventRole, 1, 10*time.Second)
	unblock()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out := readAll(ctx, ra); out.err != nil || out.body != "answer" {
		t.Fatalf("owner's reader: %+v", out)
	}
	if out := readAll(ctx, rc); out.err != nil || out.body != "answer" || out.role != RoleFollower {
		t.Fatalf("a caller that came after a lease: %+v; want the answer, as a follower", out)
	}
	if n := rp.calls.Load(); n != 1 {
		t.Errorf("owner function ran %d times, want 1", n)
	}
	if n := rec.count(EventTakeover); n != 0 {
		t.Errorf("%d takeovers while the final write was being made", n)
	}
}
