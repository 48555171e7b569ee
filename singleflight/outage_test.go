package singleflight

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// The owner's final write runs on Redis (a follower elsewhere reads the done entry, and its
// client has the answer) but its reply is lost, and the owner is cut off from Redis from
// then on. While it makes the write again, its flight takes callers: one sent after the
// client elsewhere had the answer must not be given it (answered.go). The fence is set
// unless the write was refused: an unanswered write may have landed.
func TestLateJoinerOfAFlightWhoseFinalReplyWasLost(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond}
	p := &partition{cutAfter: scriptCalls(completeScript)}
	oa := o
	oa.Redis = srv.Client()
	oa.Redis.AddHook(p)
	a := backend{}.group(t, oa)
	other := backend{redis: srv}.group(t, o)

	key := uniqueKey()
	n := newNumbered()
	ra, err := a.Do(key, false, n.fn)
	if err != nil {
		t.Fatal(err)
	}
	ownerOut := readIn(ra)
	waitCond(t, 10*time.Second, "the owner running", func() bool { return n.calls.Load() == 1 })
	rb, err := other.Do(key, false, n.fn)
	if err != nil {
		t.Fatal(err)
	}
	rbOut := readIn(rb)
	following(t, other, key, rbOut)
	close(n.gate)
	if out := <-rbOut; out.body != "answer-1" {
		t.Fatalf("the follower elsewhere got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	// A request sent from then on, to the owner's instance.
	late, err := a.Do(key, false, n.fn)
	if err != nil {
		t.Fatal(err)
	}
	lateOut := readIn(late)
	if out := <-ownerOut; out.err != nil || out.body != "answer-1" {
		t.Errorf("the owner's caller got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	if out := <-lateOut; out.body == "answer-1" {
		t.Fatalf("a request sent after a client had answer-1 was given it as if in flight")
	}
}

// partition, once cut, fails every command of its client without sending it, as a network
// partition between one instance and Redis would; it is cut right after the first command
// that cutAfter accepts ran on Redis, whose reply is then lost.
type partition struct {
	cut      atomic.Bool
	cutAfter func(redis.Cmder) bool
}

var errPartitioned = errors.New("read tcp: connection reset by peer (test partition)")

func (p *partition) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *partition) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if p.cut.Load() {
			cmd.SetErr(errPartitioned)
			return errPartitioned
		}
		err := next(ctx, cmd)
		if err == nil && p.cutAfter(cmd) && p.cut.CompareAndSwap(false, true) {
			cmd.SetErr(errPartitioned) // it ran; its reply is lost
			return errPartitioned
		}
		return err
	}
}
func (p *partition) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.cut.Load() {
			return failAll(cmds, errPartitioned)
		}
		return next(ctx, cmds)
	}
}
