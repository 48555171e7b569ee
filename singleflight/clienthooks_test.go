package singleflight

import (
	"context"
	"crypto/sha1"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// failAll gives every command of a pipeline err, as a pipeline that did not reach Redis
// gets, and returns it.
func failAll(cmds []redis.Cmder, err error) error {
	for _, c := range cmds {
		c.SetErr(err)
	}
	return err
}

// cmdCounter is a client hook counting the commands that match (every one when match is
// nil): calls, and the round trips that carry them (a pipeline is one).
type cmdCounter struct {
	match    func(redis.Cmder) bool
	n, calls atomic.Int64 // round trips, commands
}

func (c *cmdCounter) count(cmds ...redis.Cmder) {
	k := 0
	for _, cmd := range cmds {
		if c.match == nil || c.match(cmd) {
			k++
		}
	}
	if k > 0 {
		c.n.Add(1)
		c.calls.Add(int64(k))
	}
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.count(cmd); return next(ctx, cmd) }
}

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.count(cmds...); return next(ctx, cmds) }
}

// renewalsIn is what cmds carry of the renewer's: whether they start a round (the alive
// message), the meta keys they renew by SHA, and how many renewals carry the script's text.
func renewalsIn(cmds []redis.Cmder) (start bool, bySHA []string, texts int) {
	for _, c := range cmds {
		a := c.Args()
		switch {
		case len(a) > 0 && a[0] == "publish":
			start = true
		case len(a) > 3 && a[0] == "evalsha" && a[1] == renewScript.Hash():
			bySHA = append(bySHA, a[3].(string))
		case len(a) > 1 && a[0] == "eval" && a[1] == wakeSrc+restoreSrc+renewSrc:
			texts++
		}
	}
	return start, bySHA, texts
}

// scriptRuns matches the EVALSHAs of script.
func scriptRuns(script *redis.Script) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return len(a) > 1 && a[0] == "evalsha" && a[1] == script.Hash()
	}
}

// scriptCalls matches the runs of script, by EVALSHA or (the first, on a Redis that did not
// have it) EVAL.
func scriptCalls(script *redis.Script) func(redis.Cmder) bool {
	bySHA := scriptRuns(script)
	return func(cmd redis.Cmder) bool {
		if bySHA(cmd) {
			return true
		}
		a := cmd.Args()
		if len(a) < 2 || a[0] != "eval" {
			return false
		}
		src, _ := a[1].(string)
		return fmt.Sprintf("%x", sha1.Sum([]byte(src))) == script.Hash()
	}
}

// productClient is a client of srv set up as the proxy sets up its own (see newRedis in
// cmd/llm-dedupe-proxy): one dial per attempt, two retries.
func productClient(t *testing.T, srv *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second,
		WriteTimeout: time.Second, MaxRetries: 2, DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// outageOpts are the settings of the tests of a Redis out of reach for longer than a lease.
var outageOpts = Options{LeaseTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond, RedisTimeout: 300 * time.Millisecond,
	ResultTTL: time.Minute, BatchDelay: time.Millisecond}

// behindLink is a Group that reaches srv through a fault proxy, with a client set up as
// the proxy's own, and reports each timeout's confirmation PING on confirmed.
func behindLink(t *testing.T, srv *redistest.Server, o Options) (g *Group, link *faultproxy.Proxy, confirmed <-chan bool) {
	t.Helper()
	link, err := faultproxy.Listen(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	o.Redis = redis.NewClient(&redis.Options{Addr: link.Addr(), DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second,
		WriteTimeout: time.Second, MaxRetries: 2, DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { o.Redis.Close() })
	g = backend{}.group(t, o)
	<-g.Listening()
	ch := make(chan bool, 4)
	g.hooks.confirmed = func(answers bool) { ch <- answers }
	return g, link, ch
}

// pingUnanswered waits for the end of a confirmation PING, which must have gone unanswered.
func pingUnanswered(t *testing.T, confirmed <-chan bool) {
	t.Helper()
	select {
	case answers := <-confirmed:
		if answers {
			t.Fatal("the confirmation PING was answered; want Redis hanging")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no confirmation PING ended within 5s")
	}
}

// findsHanging has g confirm a timeout on key's shard, as a caller's operation would, and
// waits until the PING that did not answer degraded it.
func findsHanging(t *testing.T, g *Group, key string, confirmed <-chan bool) {
	t.Helper()
	g.rem().confirm(g.rem().keys(key).meta, context.DeadlineExceeded)
	pingUnanswered(t, confirmed)
	if !g.rem().hangingFor(key) {
		t.Fatal("the shard is not marked hanging")
	}
}
