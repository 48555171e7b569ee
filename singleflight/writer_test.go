package singleflight

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// appendHook reports every append the owner sends (its batch number), and makes the one
// numbered failN look failed after Redis ran it: a reply lost on the way back.
type appendHook struct {
	failN string
	sent  chan string
}

func (h *appendHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *appendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *appendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		if len(a) > 6 && a[0] == "evalsha" && a[1] == appendScript.Hash() {
			n := fmt.Sprint(a[6])
			h.sent <- n
			if n == h.failN && err == nil {
				h.failN = "" // once
				// A reply lost on the way is a read that times out: a PING then finds Redis
				// answering, and the shard is not degraded.
				err = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
				cmd.SetErr(err)
			}
		}
		return err
	}
}

// An append that landed but whose reply was lost is retried exactly as it was: a remote
// follower gets every byte, once.
func TestAppendRetryKeepsBytes(t *testing.T) {
	srv := redistest.Start(t)
	hook := &appendHook{failN: "2", sent: make(chan string, 100)}
	ownerClient := srv.Client()
	ownerClient.AddHook(hook)
	o := Options{BatchDelay: time.Millisecond, LeaseTTL: 3 * time.Second}
	oa := o
	oa.Redis = ownerClient
	a := New(oa)
	t.Cleanup(func() { a.Close(context.Background()) })
	b := backend{redis: srv}.group(t, o)
	following := make(chan struct{}) // b looked up and follows: a may write
	b.hooks.beforeFollow = once(func() { close(following) })
	key := uniqueKey()
	started := make(chan struct{})
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		close(started)
		<-following
		for i, s := range []string{"A", "B", "C", "D"} {
			if _, err := w.Write([]byte(s)); err != nil {
				return Result{}, err
			}
			// Wait until this write's batch went out, so that each write is one batch.
			for n := <-hook.sent; n != fmt.Sprint(i+1); n = <-hook.sent {
			}
		}
		return Result{Outcome: Store}, nil
	}
	ra, _ := a.Do(key, false, fn)
	<-started
	rb, _ := b.Do(key, false, fn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan outcome, 1)
	go func() { done <- readAll(ctx, rb) }()
	if got := readAll(ctx, ra); got.body != "ABCD" {
		t.Fatalf("owner got %q; want ABCD", got.body)
	}
	if got := <-done; got.body != "ABCD" || got.role != RoleFollower {
		t.Fatalf("remote follower got (%q, %v, %v); want ABCD as follower", got.body, got.role, got.err)
	}
}

// A stream longer than StreamMaxLen entries is not trimmed under its readers: the owner
// stops appending at the cap and its final write carries the rest; a follower that joined
// at the start and one that joined late both get the whole answer.
func TestStreamCapFinalWriteCarriesTheRest(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{BatchDelay: time.Millisecond, StreamMaxLen: 4}
	a, f := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	var want strings.Builder
	for i := range 20 {
		fmt.Fprintf(&want, "%d,", i)
	}
	early := make(chan struct{})
	late := make(chan struct{})
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		for i := range 20 {
			if i == 1 {
				close(early)
				<-late
			}
			fmt.Fprintf(w, "%d,", i)
		}
		return Result{Outcome: Share}, nil
	}
	ra, _ := a.Do(key, false, fn)
	<-early
	r1, _ := f.Do(key, false, fn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := r1.Next(ctx); err != nil || string(c) != "0," {
		t.Fatalf("early follower: first chunk (%q, %v); want 0,", c, err)
	}
	close(late)
	r2, _ := f.Do(key, false, fn) // joins the same local flight mid-stream
	got1, got2 := readAll(ctx, r1), readAll(ctx, r2)
	if "0,"+got1.body != want.String() || got2.body != want.String() {
		t.Fatalf("followers got %q and %q; want %q", "0,"+got1.body, got2.body, want.String())
	}
	readAll(ctx, ra)
}
