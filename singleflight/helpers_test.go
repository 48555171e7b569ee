package singleflight

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// backend makes Groups of one kind; Groups made by one backend share a coordinator.
type backend struct {
	name  string
	redis *redistest.Server
}

func (b backend) group(t *testing.T, o Options) *Group {
	t.Helper()
	if b.redis != nil {
		o.Redis = b.redis.Client()
	}
	if o.TakeoverJitter == 0 {
		o.TakeoverJitter = 20 * time.Millisecond
	}
	g := New(o)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return g
}

// backends returns the in-memory backend and a Redis backend on a fresh redis-server.
func backends(t *testing.T) []backend {
	return []backend{{name: "memory"}, {name: "redis", redis: redistest.Start(t)}}
}

func uniqueKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reply is an owner function that counts its calls and answers body once gate is closed.
type reply struct {
	calls atomic.Int32
	gate  chan struct{}
	body  string
}

func newReply(body string) *reply { return &reply{gate: make(chan struct{}), body: body} }

func (rp *reply) fn(ctx context.Context, w *Writer) (Result, error) {
	rp.calls.Add(1)
	select {
	case <-rp.gate:
	case <-ctx.Done():
		return Result{}, context.Cause(ctx)
	}
	return Result{Head: Head{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}}, Body: []byte(rp.body)}, nil
}

func (rp *reply) release() { close(rp.gate) }

// outcome is what one caller got.
type outcome struct {
	head Head
	body string
	role Role
	age  time.Duration
	err  error
}

func readAll(ctx context.Context, r *Reader) outcome {
	defer r.Close()
	var b []byte
	for {
		c, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return outcome{head: r.Head(), body: string(b), role: r.Role(), age: r.Age()}
		}
		if err != nil {
			return outcome{head: r.Head(), body: string(b), role: r.Role(), err: err}
		}
		b = append(b, c...)
	}
}

// doAll starts n callers of key on g and returns a function that waits for their outcomes.
func doAll(t *testing.T, g *Group, key string, n int, fn Func) func() []outcome {
	t.Helper()
	readers := make([]*Reader, n)
	for i := range readers {
		r, err := g.Do(key, false, fn)
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		readers[i] = r
	}
	return func() []outcome {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out := make([]outcome, n)
		var wg sync.WaitGroup
		for i, r := range readers {
			wg.Go(func() { out[i] = readAll(ctx, r) })
		}
		wg.Wait()
		return out
	}
}

func countRoles(outs []outcome) map[Role]int {
	m := map[Role]int{}
	for _, o := range outs {
		m[o.role]++
	}
	return m
}

// recorder is an Observer that lets a test wait for an event.
type recorder struct {
	mu     sync.Mutex
	events []Event
	ch     chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{})} }

func (r *recorder) Observe(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	close(r.ch)
	r.ch = make(chan struct{})
}

func (r *recorder) count(k EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// doAsync calls g.DoWith on a goroutine of its own (an Inline caller leads its flight on
// it) and hands over its reader when DoWith returns.
func doAsync(t *testing.T, g *Group, key string, o CallOptions, fn Func) <-chan *Reader {
	led := make(chan *Reader, 1)
	go func() {
		r, err := g.DoWith(key, o, fn)
		if err != nil {
			t.Error(err)
		}
		led <- r
	}()
	return led
}

// waitMatch waits until an event that match accepts was observed.
func (r *recorder) waitMatch(t testing.TB, what string, match func(Event) bool, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for seen := 0; ; {
		r.mu.Lock()
		ch, events := r.ch, r.events[seen:]
		seen = len(r.events)
		r.mu.Unlock()
		for _, e := range events {
			if match(e) {
				return
			}
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, timeout)
		}
	}
}

// waitFor waits until at least n events of kind k were observed.
func (r *recorder) waitFor(t testing.TB, k EventKind, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		ch := r.ch
		r.mu.Unlock()
		if r.count(k) >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waited %v for %d events of kind %d; got %d", timeout, n, k, r.count(k))
		}
	}
}

// started returns an owner function that signals each call on a channel, then runs next.
func started(ch chan<- struct{}, next Func) Func {
	return func(ctx context.Context, w *Writer) (Result, error) {
		ch <- struct{}{}
		return next(ctx, w)
	}
}

// waitCond polls cond (for states that announce no event) until it holds or limit passes.
func waitCond(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	redistest.WaitUntil(t, limit, what, func() (bool, string) {
		return cond(), fmt.Sprintf("%d goroutines", runtime.NumGoroutine())
	})
}

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

// ownEach starts n flights of new keys on g, the i-th run by fn(i), and waits until g
// owns them all.
func ownEach(t *testing.T, g *Group, n int, fn func(i int) Func) ([]string, []*Reader) {
	t.Helper()
	keys := make([]string, n)
	readers := make([]*Reader, n)
	for i := range keys {
		keys[i] = uniqueKey()
		r, err := g.Do(keys[i], false, fn(i))
		if err != nil {
			t.Fatal(err)
		}
		readers[i] = r
	}
	waitCond(t, 10*time.Second, "owners running", func() bool { return g.Owned() == n })
	return keys, readers
}

// followEach starts a flight of each key on g and waits until every one follows.
func followEach(t *testing.T, g *Group, keys []string, fn Func) []*Reader {
	t.Helper()
	readers := make([]*Reader, len(keys))
	for i, k := range keys {
		r, err := g.Do(k, false, fn)
		if err != nil {
			t.Fatal(err)
		}
		readers[i] = r
	}
	waitCond(t, 10*time.Second, "every flight following", func() bool {
		for _, k := range keys {
			if g.flightRole(k) != RoleFollower {
				return false
			}
		}
		return true
	})
	return readers
}

// stuckOwner starts key's flight on g with an owner function that ignores its context and
// returns only when the test ends, and waits until it runs.
func stuckOwner(t *testing.T, g *Group, key string) {
	t.Helper()
	stuck := make(chan struct{})
	running := make(chan struct{}, 1)
	r, err := g.Do(key, false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-stuck // ignores ctx
		return Result{}, errors.New("stuck")
	}))
	if err != nil {
		t.Fatal(err)
	}
	<-running
	t.Cleanup(func() { r.Close(); close(stuck) })
}
