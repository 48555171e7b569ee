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

// finalWriteHook holds every final write (complete) once it is sent, until release is
// closed, saying whose it holds; and reports each renewal round sent meanwhile (a pipeline
// carrying the alive message): its number, and the flights it renewed.
type finalWriteHook struct {
	rn      func() *renewer
	held    chan string // the meta key of each final write held
	release chan struct{}
	rounds  chan roundSeen
}

type roundSeen struct {
	n       int64
	renewed []string // meta keys
}

func (h *finalWriteHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *finalWriteHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 3 && a[0] == "evalsha" && a[1] == completeScript.Hash() {
			h.held <- a[3].(string)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *finalWriteHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		alive, renewed := false, []string(nil)
		for _, cmd := range cmds {
			a := cmd.Args()
			alive = alive || len(a) > 0 && a[0] == "publish"
			if len(a) > 3 && a[0] == "evalsha" && a[1] == renewScript.Hash() {
				renewed = append(renewed, a[3].(string))
			}
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

// A lease whose final write is on its way to Redis is not renewed by any round that begins
// after the write went out, however long the write takes; one whose final write is still
// queued in the batcher (every pipeline out) is renewed once each round (half an interval
// in). The alive message goes each round, and nobody takes a flight over meanwhile.
func TestRenewalStopsOnceFinalWriteIsSent(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 100 * time.Millisecond
	const n = maxPipelines + 1 // the batcher sends maxPipelines at once: one stays queued
	var a *Group
	hook := &finalWriteHook{rn: func() *renewer { return a.remote.renewer },
		held: make(chan string, n), release: make(chan struct{}), rounds: make(chan roundSeen, 100)}
	client := srv.Client()
	client.AddHook(hook)
	// The lease (and so the final writes' deadline) is long next to the rounds the test
	// watches while it holds the writes.
	o := Options{HeartbeatInterval: interval, LeaseTTL: 5 * time.Second}
	oa := o
	oa.Redis = client
	a = New(oa)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.Close(ctx)
	})
	// Each owner answers when told, so that the final writes go out one at a time: the
	// first maxPipelines each alone (and held), the last queued behind them.
	rps := make([]*reply, n)
	for i := range rps {
		rps[i] = newReply("answer")
	}
	unblock := sync.OnceFunc(func() { close(hook.release) })
	t.Cleanup(func() { // before a is closed, whatever failed
		unblock()
		for _, rp := range rps {
			select {
			case <-rp.gate:
			default:
				rp.release()
			}
		}
	})
	rec := newRecorder()
	ob := o
	ob.Observer = rec
	b := backend{redis: srv}.group(t, ob)

	keys, owners := ownEach(t, a, n, func(i int) Func { return rps[i].fn })
	followers := followEach(t, b, keys, rps[0].fn)
	var held []string
	for i := range maxPipelines {
		rps[i].release()
		select {
		case m := <-hook.held:
			held = append(held, m)
		case <-time.After(10 * time.Second):
			t.Fatalf("final write %d was never sent", i)
		}
	}
	rps[n-1].release()
	waitCond(t, 10*time.Second, "the last final write queued", func() bool {
		a.remote.batch.mu.Lock()
		defer a.remote.batch.mu.Unlock()
		return len(a.remote.batch.queue) == 1
	})
	heldIn := a.remote.renewer.round.Load()
	queued := []string{"ai:flight:meta:{" + keys[n-1] + "}"}

	// Three rounds begun while maxPipelines final writes were out and one queued (each
	// round is whole once the next has begun).
	seen := map[int64][][]string{} // each round's pipelines
	for len(seen) < 4 {
		select {
		case r := <-hook.rounds:
			if r.n > heldIn {
				seen[r.n] = append(seen[r.n], r.renewed)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("renewal rounds seen after the final writes were sent: %v", seen)
		}
	}
	unblock()
	for r := heldIn + 1; r <= heldIn+3; r++ {
		if renewed := slices.Concat(seen[r]...); !slices.Equal(renewed, queued) {
			t.Errorf("round %d after the final writes went out renewed %q; want only the queued one's, %q", r-heldIn, renewed, queued)
		}
		if len(seen[r]) > 0 && len(seen[r][0]) > 0 {
			t.Errorf("round %d renewed %q at once; a queued final write's lease waits half an interval", r-heldIn, seen[r][0])
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, r := range append(owners, followers...) {
		if out := readAll(ctx, r); out.err != nil || out.body != "answer" {
			t.Fatalf("reader %d: %+v", i, out)
		}
	}
	for i, rp := range rps {
		if c := rp.calls.Load(); c != 1 {
			t.Errorf("owner function %d ran %d times", i, c)
		}
	}
	if c := rec.count(EventTakeover); c != 0 {
		t.Errorf("%d takeovers while the final writes were out", c)
	}
}
