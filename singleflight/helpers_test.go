package singleflight

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A closed go-redis pool's redial of a dead Cluster node sleeps out its second.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
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
	return r.countWhere(func(e Event) bool { return e.Kind == k })
}

// eventsOf returns the events of kind k observed so far.
func (r *recorder) eventsOf(k EventKind) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.events {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// countWhere counts the events observed that match accepts.
func (r *recorder) countWhere(match func(Event) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if match(e) {
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

// waitCond polls cond (for states that announce no event) until it holds or limit passes.
func waitCond(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := condWithin(limit, what, cond); err != nil {
		t.Fatal(err)
	}
}

// condWithin is waitCond for a goroutine other than the test's: it returns the failure.
func condWithin(limit time.Duration, what string, cond func() bool) error {
	return redistest.Until(limit, what, func() (bool, string) {
		return cond(), fmt.Sprintf("%d goroutines", runtime.NumGoroutine())
	})
}

// joining hands the test's goroutine a caller that a hook started (a hook runs on a
// Group's goroutine, where the test must not be failed), or why it has none.
type joining chan joined

type joined struct {
	r   *Reader
	err error
}

func newJoining() joining { return make(joining, 1) }

// join starts a caller of key on g and, if cond is not nil, waits until cond holds (what
// names it); the test's goroutine takes the outcome with take.
func (j joining) join(g *Group, key string, o CallOptions, fn Func, what string, cond func() bool) {
	r, err := g.DoWith(key, o, fn)
	if err == nil && cond != nil {
		err = condWithin(5*time.Second, what, cond)
	}
	j <- joined{r, err}
}

// take returns the caller a hook started, failing the test if it has none.
func (j joining) take(t *testing.T) *Reader {
	t.Helper()
	select {
	case got := <-j:
		if got.err != nil {
			t.Fatalf("a caller started by a hook: %v", got.err)
		}
		return got.r
	case <-time.After(10 * time.Second):
		t.Fatal("no hook started a caller within 10s")
		return nil
	}
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

// readWithin reads r to its end, giving up after d.
func readWithin(r *Reader, d time.Duration) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return readAll(ctx, r)
}

// streamReader reads r in the background; first is closed once it delivered bytes.
type streamReader struct {
	first chan struct{}
	done  chan outcome
}

func readStream(ctx context.Context, r *Reader) *streamReader {
	s := &streamReader{first: make(chan struct{}), done: make(chan outcome, 1)}
	go func() {
		defer r.Close()
		var b []byte
		var once sync.Once
		for {
			c, err := r.Next(ctx)
			if len(c) > 0 {
				b = append(b, c...)
				once.Do(func() { close(s.first) })
			}
			if errors.Is(err, io.EOF) {
				s.done <- outcome{head: r.Head(), body: string(b), role: r.Role()}
				return
			}
			if err != nil {
				s.done <- outcome{head: r.Head(), body: string(b), role: r.Role(), err: err}
				return
			}
		}
	}()
	return s
}

// firstChunk joins key's flight on g and reads its first chunk.
func firstChunk(t *testing.T, g *Group, key string, fn Func) *Reader {
	t.Helper()
	r, err := g.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(context.Background()); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	return r
}

// once returns a hook that runs fn the first time it is called, and nothing after.
func once(fn func()) func() {
	var o sync.Once
	return func() { o.Do(fn) }
}

// owned is a unary flight a owns, answering "call 1" once released.
type owned struct {
	*reply
	key string
}

// ownAndFollow starts a unary flight of a new key on a, held until released, and a caller
// of it on other, once other follows it.
func ownAndFollow(t *testing.T, a, other *Group) (rp owned, owner <-chan *Reader, follower *Reader) {
	t.Helper()
	rp = owned{newReply("call 1"), uniqueKey()}
	running := make(chan struct{}, 2)
	fn := started(running, rp.fn)
	owner = doAsync(t, a, rp.key, CallOptions{Inline: true}, fn)
	<-running
	follower, err := other.Do(rp.key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 5*time.Second, "the other instance follows", func() bool { return other.flightRole(rp.key) == RoleFollower })
	return rp, owner, follower
}

// readIn reads r in the background.
func readIn(r *Reader) <-chan outcome {
	got := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		got <- readAll(ctx, r)
	}()
	return got
}

// heldFollower is a Group whose parked followers can be held before they go on.
type heldFollower struct {
	g       *Group
	reads   *cmdCounter // XREADs
	holding atomic.Bool
	hold    chan struct{}
}

func newHeldFollower(t *testing.T, srv *redistest.Server, o Options) *heldFollower {
	h := &heldFollower{hold: make(chan struct{}), reads: &cmdCounter{match: func(c redis.Cmder) bool { return c.Name() == "xread" }}}
	o.Redis = srv.Client()
	o.Redis.AddHook(h.reads)
	h.g = New(o)
	h.g.hooks.resumed = func() {
		if h.holding.Load() {
			<-h.hold
		}
	}
	t.Cleanup(func() {
		h.release()
		h.g.Close(context.Background())
	})
	return h
}

// follow starts a caller of key that follows the flight running elsewhere, and waits until
// its flight has read the stream once (when its subscription was confirmed) and parked:
// from then on it is held before it reads what is pushed.
func (h *heldFollower) follow(t *testing.T, key string, noCache bool, fn Func) (*Reader, <-chan outcome) {
	t.Helper()
	r, err := h.g.Do(key, noCache, fn)
	if err != nil {
		t.Fatal(err)
	}
	lkey := key
	if noCache {
		lkey += "\x00nocache"
	}
	waitCond(t, 10*time.Second, "following", func() bool { return h.g.flightRole(lkey) == RoleFollower })
	waitCond(t, 10*time.Second, "subscription confirmed and read", func() bool { return h.reads.n.Load() >= 1 })
	h.holding.Store(true)
	return r, readIn(r)
}

func (h *heldFollower) release() {
	select {
	case <-h.hold:
	default:
		close(h.hold)
	}
}

// flightRole is the role of key's local flight, for tests and benchmarks that must wait for
// it.
func (g *Group) flightRole(key string) Role {
	g.mu.Lock()
	f := g.flights[key]
	g.mu.Unlock()
	if f == nil {
		return RoleUnknown
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.role
}

// flightBytes is what key's local flight holds of its current generation's body.
func (g *Group) flightBytes(key string) string {
	g.mu.Lock()
	f := g.flights[key]
	g.mu.Unlock()
	if f == nil {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(bytes.Join(f.chunks, nil))
}

// storeOne runs one flight of key on g with an answer that is stored, and returns it.
func storeOne(t *testing.T, g *Group, key, body string) outcome {
	t.Helper()
	rp := newReply(body)
	rp.release()
	return doAll(t, g, key, 1, rp.fn)()[0]
}
