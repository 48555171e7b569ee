package singleflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors reported by the package. Check them with errors.Is.
var (
	// ErrLeaseLost is the cause of an owner's flight context when another owner took over.
	ErrLeaseLost = errors.New("singleflight: lease lost")
	// ErrFlightGone is the error of an owner's renewal (EventHeartbeatFailed) when Redis
	// lost the flight and the owner's lease ran out before it could put it back (an outage
	// longer than the lease, then a restart without persistence): nobody holds the flight
	// in Redis, and the owner cannot tell whether another took it over and finished
	// meanwhile. Its call goes on for the callers in its process; it stops renewing and
	// appending, and its final write, fenced, decides.
	ErrFlightGone = errors.New("singleflight: Redis lost the flight after its lease ran out")
	// ErrTimeout is the cause of an owner's flight context when the hard timeout ran out.
	ErrTimeout = errors.New("singleflight: owner timed out")
	// ErrShutdown is the cause of an owner's flight context when the Group was closed.
	ErrShutdown = errors.New("singleflight: shutdown")
	// ErrFailed means the flight failed on every attempt without a response to share.
	ErrFailed = errors.New("singleflight: flight failed")
	// ErrGenerationChanged means the owner changed after this reader had received bytes of
	// the old owner's response; the rest of that response will never come.
	ErrGenerationChanged = errors.New("singleflight: generation changed")
	// ErrClosed is returned by a Group that has been closed.
	ErrClosed = errors.New("singleflight: closed")
	// ErrPanic wraps a panic recovered from an owner function.
	ErrPanic = errors.New("singleflight: owner panicked")
)

// Role says how a caller was served.
type Role uint8

// Roles.
const (
	RoleUnknown  Role = iota
	RoleOwner         // this caller's process ran the upstream call for it
	RoleFollower      // another caller's upstream call served it
	RoleHit           // a stored result served it
)

func (r Role) String() string {
	switch r {
	case RoleOwner:
		return "owner"
	case RoleFollower:
		return "follower"
	case RoleHit:
		return "hit"
	}
	return "unknown"
}

// Head is the status and the headers worth replaying of a response.
type Head struct {
	Status int
	Header map[string][]string
	// Note is what Options.Annotate made of a stored answer, given with it to its hits
	// served from this process's store; nil otherwise. It never leaves the process.
	Note any
}

// Outcome says what may be done with a response.
type Outcome uint8

// Outcomes.
const (
	// Store shares the response with every waiter and stores it for Options.ResultTTL.
	Store Outcome = iota
	// Share shares the response with this flight's waiters only.
	Share
	// Retry marks this attempt failed: another waiter takes over, up to MaxAttempts; the
	// response is what the waiters get when no attempt is left.
	Retry
)

// Result is what an owner function returns. Body, if any, follows what was written to the
// Writer; Head is used when WriteHead was not called.
type Result struct {
	Head    Head
	Body    []byte
	Outcome Outcome
	// TTL keeps a Store outcome this long instead of Options.ResultTTL (a store policy per
	// route or model). If zero, Options.ResultTTL is used.
	TTL time.Duration
}

// Func runs the upstream call of a flight. ctx is the flight context: detached from every
// caller, ended by the hard timeout, by a lost lease or by shutdown (see context.Cause). A
// non-nil error makes the attempt fail as with Outcome Retry.
type Func func(ctx context.Context, w *Writer) (Result, error)

// Options configures a Group. Zero values are replaced by the defaults given.
type Options struct {
	// Redis coordinates instances. If nil, the Group is in-memory: local flights and a
	// bounded TTL result cache.
	Redis redis.UniversalClient
	// KeyPrefix of every Redis key. If empty, "ai:flight" is used.
	KeyPrefix string
	// HeartbeatInterval between lease renewals. If zero, 1s is used.
	HeartbeatInterval time.Duration
	// LeaseTTL of an owner. If zero, 3s is used.
	LeaseTTL time.Duration
	// TakeoverJitter is the upper bound of the random wait before a takeover. If zero,
	// 500ms is used; negative means none.
	TakeoverJitter time.Duration
	// MaxAttempts of upstream calls per flight. If zero, 3 is used.
	MaxAttempts int
	// ResultTTL keeps Store outcomes for later identical requests. Zero stores nothing.
	ResultTTL time.Duration
	// Linger keeps a finished flight's stream readable for late followers. If zero, 30s.
	Linger time.Duration
	// Timeout is the hard limit of one owner function. If zero, 10m is used.
	Timeout time.Duration
	// BatchDelay and BatchBytes bound how long streamed bytes wait before they are
	// appended to Redis. If zero, 5ms and 16 KiB are used.
	BatchDelay time.Duration
	BatchBytes int
	// StreamMaxLen caps the entries of one flight's stream. If zero, 10000 is used.
	StreamMaxLen int
	// MemoryMaxEntries bounds the results kept in this process: the result store without
	// Redis, a first level in front of it with Redis. If zero, 10000 is used.
	MemoryMaxEntries int
	// MemoryMaxBytes bounds the same results in bytes (bodies, headers and keys): the least
	// recently used go first, and a result larger than the bound is not kept in the process.
	// If zero, 128 MiB is used.
	MemoryMaxBytes int64
	// Observer receives the package's events. If nil, they are dropped.
	Observer Observer
	// Annotate, if set, is called once for each answer kept in this process (made here or
	// read from Redis), outside the Group's locks, and what it returns is given with the
	// answer to each hit served from this process's store as Head.Note: what every hit
	// would work out from the body is worked out once, the hit that read it from Redis
	// included. Owners and followers get no Note. If nil, hits get no Note.
	Annotate func(h Head, body []byte) any
	// InstanceID names this process in tokens and meta. If empty, a random one is used.
	InstanceID string
	// MaxResultTTL is the longest TTL any Result asks for: a namespace's generation is
	// kept that long after its last purge (see PurgeNamespace). If zero, ResultTTL.
	MaxResultTTL time.Duration
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.HeartbeatInterval, time.Second)
	def(&o.LeaseTTL, 3*time.Second)
	def(&o.TakeoverJitter, 500*time.Millisecond)
	def(&o.Linger, 30*time.Second)
	def(&o.Timeout, 10*time.Minute)
	def(&o.BatchDelay, 5*time.Millisecond)
	if o.TakeoverJitter < 0 {
		o.TakeoverJitter = 0
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "ai:flight"
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 16 << 10
	}
	if o.StreamMaxLen <= 0 {
		o.StreamMaxLen = 10000
	}
	if o.MemoryMaxEntries <= 0 {
		o.MemoryMaxEntries = 10000
	}
	if o.MemoryMaxBytes <= 0 {
		o.MemoryMaxBytes = 128 << 20
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.InstanceID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.InstanceID = hex.EncodeToString(b[:])
	}
}

// Group coalesces calls by key, in this process and, with Redis, across processes.
type Group struct {
	opts    Options
	ctx     context.Context // ends when the Group is closed
	stop    context.CancelCauseFunc
	wg      sync.WaitGroup
	cacheMu sync.Mutex
	cache   *store  // stored results in this process; see cached
	remote  *remote // Redis mode only

	mu        sync.Mutex
	flights   map[string]*flight
	owned     map[*flight]bool // flights whose owner function runs here
	ownedIdle chan struct{}    // closed and replaced when owned shrinks
	closed    bool

	degraded atomic.Bool
	hooks    hooks
	inv      invalidation // purges and namespace generations; see purge.go
}

// hooks let the package's tests stop the world at the points where faults matter.
type hooks struct {
	beforeRenew  func(ctx context.Context) // blocks a heartbeat (a paused or dead owner)
	beforeFollow func()                    // runs between a follower's lookup and its subscription
	readGap      func()                    // a follower's read found nothing (or failed), before it looks again
	afterEntries func()                    // a follower applied one read's entries, before its next read
	beforeClaim  func()                    // a contender is about to run claim.lua
	aliveHeard   func()                    // the hub heard an alive message
	resumed      func()                    // a parked follower was woken
	completed    func()                    // an owner's final write landed, before its flight ends here
	leadStarted  func()                    // a flight's lead goroutine started; its first caller is not counted yet (g.mu held)
	probed       func()                    // the probe of a degraded Redis asked it once
}

type storedResult struct {
	head Head
	body []byte
	at   time.Time     // monotonic: age and expiry never depend on wall-clock steps
	ttl  time.Duration // kept until at+ttl
}

// cached returns key's stored result if it has not expired.
func (g *Group) cached(key string) (storedResult, bool) {
	g.cacheMu.Lock()
	defer g.cacheMu.Unlock()
	sr, ok := g.cache.get(key)
	if !ok {
		return sr, false
	}
	if time.Since(sr.at) >= sr.ttl {
		g.cache.remove(key)
		return sr, false
	}
	return sr, true
}

// keep stores a result in this process, made age ago.
func (g *Group) keep(key string, head Head, body []byte, age time.Duration) {
	g.keepFor(key, head, body, age, g.opts.ResultTTL)
}

// New returns a Group. Close it to stop its goroutines.
func New(opts Options) *Group {
	opts.setDefaults()
	ctx, stop := context.WithCancelCause(context.Background())
	g := &Group{opts: opts, ctx: ctx, stop: stop, flights: map[string]*flight{}, owned: map[*flight]bool{}, ownedIdle: make(chan struct{})}
	// An LRU bounded in entries and bytes whose entries expire when read (see cached), with
	// no cleanup goroutine. Without Redis it is the result store; with Redis a first level
	// in front of it, so that a hit costs no round trip, and hits go on while Redis is down.
	g.cache = newStore(opts.MemoryMaxEntries, opts.MemoryMaxBytes)
	if opts.Redis != nil {
		g.remote = newRemote(g)
	}
	g.startInvalidation()
	return g
}

// Backend names the coordinator: "redis" or "memory".
func (g *Group) Backend() string {
	if g.remote != nil {
		return "redis"
	}
	return "memory"
}

// Degraded reports whether a Redis Group is serving local-only because Redis failed.
func (g *Group) Degraded() bool { return g.degraded.Load() }

// Do joins the flight of key, starting it with fn if this process has none. It does not
// wait: the caller's Reader blocks in Next. A result stored in this process is served
// at once, without a flight to join (fn is then never called). With noCache, a stored
// result is not served (an in-flight one is still joined). The caller must Close the
// Reader.
func (g *Group) Do(key string, noCache bool, fn Func) (*Reader, error) {
	return g.DoWith(key, CallOptions{NoCache: noCache}, fn)
}

// DoWith is Do with the caller's options: freshness, and what the flights listing shows.
func (g *Group) DoWith(key string, o CallOptions, fn Func) (*Reader, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	f, lkey := g.joinableWith(key, o)
	if f == nil && !o.NoCache {
		// A stored result is looked up where lead would look it up first, after the
		// flights in progress: a caller that would have joined one still does.
		if sr, ok := g.cachedWithin(key, o.MaxAge); ok {
			g.mu.Unlock()
			return g.serveStored(key, lkey, o, sr), nil
		}
	}
	leader := f == nil
	var ctx context.Context
	if leader {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(g.ctx)
		f = newFlight(key, lkey, o.NoCache, fn, cancel)
		f.call, f.started = o, time.Now()
		g.flights[lkey] = f
		g.wg.Add(1)
		if !o.Inline {
			go g.lead(ctx, f)
			if g.hooks.leadStarted != nil {
				g.hooks.leadStarted()
			}
		}
	}
	f.mu.Lock()
	f.readers++
	f.unserved++
	f.leaderOpen = f.leaderOpen || leader
	f.mu.Unlock()
	g.mu.Unlock()
	rd := &Reader{g: g, f: f, leader: leader, fn: fn, call: o}
	if g.remote != nil {
		rd.joined = f.started
		if !leader {
			rd.joined = time.Now()
		}
	}
	if leader && o.Inline {
		g.lead(ctx, f)
	}
	return rd, nil
}

// serveStored answers a caller with a stored result at once: with a flight that has
// already ended, which no other caller joins, and no goroutine to lead it. It is what
// lead does with a stored result, events included, without the goroutine, the flight
// context and the caller's wait for both, which were most of what a hit cost.
func (g *Group) serveStored(key, lkey string, o CallOptions, sr storedResult) *Reader {
	g.observe(Event{Kind: EventFlightStart, Key: key})
	g.observe(Event{Kind: EventRole, Key: key, Role: RoleHit})
	f := newFlight(key, lkey, false, nil, noCancel)
	f.call, f.started = o, time.Now()
	f.finishHit(sr.head, sr.body, time.Since(sr.at))
	f.mu.Lock()
	f.readers, f.unserved, f.leaderOpen = 1, 1, true
	f.mu.Unlock()
	g.observe(Event{Kind: EventFlightEnd, Key: key})
	return &Reader{g: g, f: f, leader: true}
}

// noCancel is the cancel function of a flight that has no leader loop to end.
var noCancel context.CancelCauseFunc = func(error) {}

// joinable returns the local flight a caller of key joins, or nil and the map key under
// which to start one. A caller joins a flight in progress whatever its leader asked; a
// no-cache caller does not join one that may serve a stored result (a hit, or one whose
// role is not decided yet), so it gets a flight of its own; g.mu held.
func (g *Group) joinable(key string, noCache bool) (*flight, string) {
	usable := func(f *flight) bool {
		if f == nil || f.hasEnded() {
			return false // its outcome is out: a caller arriving now starts anew
		}
		if !noCache || f.noCache {
			return true
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.role == RoleOwner || f.role == RoleFollower
	}
	if f := g.flights[key]; usable(f) {
		return f, key
	}
	// The no-cache map key is made on the stack for the lookup, and a string only when
	// it is returned: every hit and every owner looks it up.
	var buf [128]byte
	nc := append(append(buf[:0], key...), "\x00nocache"...)
	if f := g.flights[string(nc)]; usable(f) {
		return f, string(nc)
	}
	if noCache {
		return nil, string(nc)
	}
	return nil, key
}

// leave is called when a reader closes.
func (g *Group) leave(f *flight, leader, delivered bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.mu.Lock()
	f.readers--
	if !delivered {
		f.unserved--
	}
	if leader {
		f.leaderOpen = false
	}
	idle := f.readers == 0 && !f.owning && !f.ended
	f.mu.Unlock()
	if idle {
		g.forget(f)
		f.cancel(context.Canceled)
	}
}

// forget removes f from the flight map, if it is still there, so that new callers start a
// new flight; g.mu held.
func (g *Group) forget(f *flight) {
	if g.flights[f.lkey] == f {
		delete(g.flights, f.lkey)
	}
}

// Close stops the Group. New calls get ErrClosed at once; flights owned here may finish
// until ctx ends; then the rest are released as FAILED("shutdown"), so that followers
// elsewhere take over at once instead of waiting for the lease to run out, and local
// readers still waiting get an error wrapping ErrShutdown. Close returns when every
// goroutine of the Group has stopped.
func (g *Group) Close(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	var err error
	for {
		g.mu.Lock()
		n, idle := len(g.owned), g.ownedIdle
		g.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-idle:
			continue
		case <-ctx.Done():
			err = fmt.Errorf("singleflight: close: %d owned flights released: %w", n, context.Cause(ctx))
		}
		break
	}
	g.stop(ErrShutdown)
	g.wg.Wait()
	return err
}

// setOwned records whether f's owner function runs here.
func (g *Group) setOwned(f *flight, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if on {
		g.owned[f] = true
		return
	}
	delete(g.owned, f)
	close(g.ownedIdle)
	g.ownedIdle = make(chan struct{})
}

// Owned is the number of flights whose upstream call runs in this process.
func (g *Group) Owned() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.owned)
}

func (g *Group) observe(e Event) { g.opts.Observer.Observe(e) }
