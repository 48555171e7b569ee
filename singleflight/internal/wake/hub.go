// Package wake is a process's wake-up hub: one pub/sub connection on which followers watch
// their flights' channels, the Group listens to its own, and the alive messages of owner
// instances are recorded. It never reaches back into the package that uses it. See ADRs
// 0012, 0014, 0055, 0057, 0081.
//
// # Goroutines
//
// A Hub runs two goroutines from its first Watch or Listen until Config.Ctx ends, counted by
// Config.WG: the sender, which alone opens the connection (conn.go) and sends SUBSCRIBE,
// UNSUBSCRIBE and PING, and the receiver, which alone reads the connection and runs
// listeners and Config.Heard. An alive channel's
// silence timer runs on a goroutine of its own. Everything they share is under Hub.mu; a
// Watch's queue is under its own mutex. Wake-ups run a watcher's hook (OnWake) on the
// goroutine that woke it: a hook must not block.
package wake

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is returned by Watch and Listen once Config.Ctx has ended.
var ErrClosed = errors.New("wake: hub closed")

// Config is what a Hub needs from its user; every func may be nil but Decode.
type Config[E any] struct {
	Redis redis.UniversalClient
	Ctx   context.Context // ends the hub's goroutines
	// WG counts the hub's goroutines. Watch and Listen add to it: their callers are
	// counted by it, or run before anything waits on it.
	WG *sync.WaitGroup
	// AlivePrefix starts every alive channel (AliveChannel); Lease is how long an alive
	// message speaks for its instance (ADR 0009).
	AlivePrefix string
	Lease       time.Duration
	// KeepIdle is how long a channel stays subscribed without watchers (ADR 0014).
	KeepIdle time.Duration
	Decode   func(payload string) (E, bool) // a message on a watched channel; false: read the stream
	Failed   func(error)                    // the connection failed (on the receiver)
	Heard    func()                         // an alive message was recorded (on the receiver)
	// Node, if set, gives the client the connection is made with, and names its server:
	// one other than avoid where it can. The hub moves off a server that fails, hangs
	// (Leave) or leaves a PING unanswered (then told to Unanswered, on the sender). In a
	// Cluster any node hears every PUBLISH (ADRs 0013, 0081). Nil: Redis.Subscribe.
	Node       func(avoid string) (redis.UniversalClient, string)
	Unanswered func(node string)
}

// Hub is a process's one pub/sub connection. Every confirmation of a subscription makes its
// watchers read the stream (ADR 0012).
type Hub[E any] struct {
	cfg Config[E]

	mu         sync.Mutex
	c          conn                              // the connection; the sender opens it (conn.go)
	heard      atomic.Int64                      // when the receiver last read anything, ns since hubEpoch
	watches    map[string]map[*Watch[E]]struct{} // channel → its watchers (a set: many followers share an alive channel)
	listeners  map[string]Listener               // channels subscribed for the hub's life
	subscribed map[string]bool                   // channels the sender has subscribed (and not left)
	pending    map[string]unconfirmed            // subscribed channels Redis has not confirmed (since it broke)
	dirty      map[string]bool                   // channels whose watchers changed since the sender looked
	idle       map[string]time.Time              // subscribed channels without watchers, since when (the sender's alone)
	idleOrder  []idleChannel                     // idle's channels in the order they went idle (the sender's alone)
	keepIdle   time.Duration
	sent       func([]string, error) // see OnSent
	flush      chan struct{}         // has room for one: dirty has channels
	down       atomic.Bool           // the connection failed and has not delivered since
	// alive: one per watched alive channel; written by the receiver (Heard), read by
	// AliveUntil's callers, under mu; its timer is stopped by the last watcher's Close.
	alive map[string]*aliveState
}

// ConfirmWithin is how long a SUBSCRIBE may go unconfirmed before it is sent again: a
// subscription holds only once Redis confirmed it (ADR 0055).
const ConfirmWithin = time.Second

type unconfirmed struct{ since, sent time.Time } // sent: when SUBSCRIBE was last sent

type idleChannel struct {
	channel string
	since   time.Time
}

// Listener handles a channel subscribed for the hub's life, on the receiver.
type Listener struct {
	Message   func(payload string)
	Confirmed func()
}

// New returns a hub that connects on its first Watch or Listen.
func New[E any](cfg Config[E]) *Hub[E] {
	return &Hub[E]{cfg: cfg, watches: map[string]map[*Watch[E]]struct{}{}, listeners: map[string]Listener{},
		subscribed: map[string]bool{}, pending: map[string]unconfirmed{}, dirty: map[string]bool{}, flush: make(chan struct{}, 1),
		alive: map[string]*aliveState{}, idle: map[string]time.Time{}, keepIdle: cfg.KeepIdle}
}

// Listen subscribes channel for as long as the hub lives.
func (h *Hub[E]) Listen(channel string, l Listener) error {
	h.mu.Lock()
	defer h.kick()
	defer h.mu.Unlock()
	if err := h.start(); err != nil {
		return err
	}
	h.listeners[channel] = l
	h.dirty[channel] = true
	return nil
}

// Down reports whether the connection failed and has delivered nothing since: what it
// would announce is to be read instead, every poll.Every.
func (h *Hub[E]) Down() bool { return h.down.Load() }

// OnSent sets fn to be told of every SUBSCRIBE the sender sends, on the sender (tests).
func (h *Hub[E]) OnSent(fn func(channels []string, err error)) {
	h.mu.Lock()
	h.sent = fn
	h.mu.Unlock()
}

// SetKeepIdle changes how long a channel without watchers stays subscribed, and has the
// sender look at once.
func (h *Hub[E]) SetKeepIdle(d time.Duration) {
	h.mu.Lock()
	h.keepIdle = d
	h.mu.Unlock()
	h.kick()
}

// Idle reports whether channel is subscribed without a watcher, waiting out KeepIdle.
func (h *Hub[E]) Idle(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, idle := h.idle[channel]
	return idle
}

func (h *Hub[E]) listenerOf(channel string) (Listener, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.listeners[channel]
	return l, ok
}

func (h *Hub[E]) kick() {
	select {
	case h.flush <- struct{}{}:
	default:
	}
}

// plan returns the channels to subscribe (new, or unconfirmed for ConfirmWithin) and to
// leave (idle for keepIdle), and when to look again; h.mu held.
func (h *Hub[E]) plan(now time.Time) (join, leave []string, next time.Time) {
	for ch := range h.dirty {
		switch on := h.on(ch); {
		case on && !h.subscribed[ch]:
			join = append(join, ch)
			h.subscribed[ch] = true
			h.pending[ch] = unconfirmed{since: now, sent: now}
		case on:
			delete(h.idle, ch)
		case h.subscribed[ch]:
			if _, ok := h.idle[ch]; !ok {
				h.idle[ch] = now
				h.idleOrder = append(h.idleOrder, idleChannel{ch, now})
			}
		}
	}
	clear(h.dirty)
	for len(h.idleOrder) > 0 && now.Sub(h.idleOrder[0].since) >= h.keepIdle {
		c := h.idleOrder[0]
		h.idleOrder = h.idleOrder[1:]
		if since, ok := h.idle[c.channel]; !ok || !since.Equal(c.since) {
			continue // watched again since; a later entry stands for it if it went idle again
		}
		delete(h.idle, c.channel)
		if !h.on(c.channel) { // a watcher that came since found it subscribed
			leave = append(leave, c.channel)
			delete(h.subscribed, c.channel)
			delete(h.pending, c.channel)
		}
	}
	if len(h.idleOrder) > 0 {
		next = h.idleOrder[0].since.Add(h.keepIdle)
	}
	for ch, p := range h.pending {
		if due := p.sent.Add(ConfirmWithin); !due.After(now) {
			join = append(join, ch)
			p.sent = now
			h.pending[ch] = p
		} else if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	if len(join) > 0 && (next.IsZero() || now.Add(ConfirmWithin).Before(next)) {
		next = now.Add(ConfirmWithin)
	}
	return join, leave, next
}

// UnconfirmedSince is when channel's subscription stopped being known to hold: zero while
// Redis has confirmed it and the connection has not broken since; now for a channel not
// subscribed yet.
func (h *Hub[E]) UnconfirmedSince(channel string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.subscribed[channel] {
		return time.Now()
	}
	return h.pending[channel].since
}

// SetUnconfirmed takes channel for subscribed and unconfirmed since since, or confirmed
// (zero since), as the receiver would (tests).
func (h *Hub[E]) SetUnconfirmed(channel string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subscribed[channel] = true
	if since.IsZero() {
		delete(h.pending, channel)
		return
	}
	h.pending[channel] = unconfirmed{since: since, sent: time.Now()}
}

// unconfirm takes every subscription for unconfirmed: the connection broke, and go-redis
// subscribes again when it reconnects. One that Redis does not confirm is sent again.
func (h *Hub[E]) unconfirm() {
	now := time.Now()
	h.mu.Lock()
	for ch := range h.subscribed {
		if _, ok := h.pending[ch]; !ok {
			h.pending[ch] = unconfirmed{since: now, sent: now}
		}
	}
	h.mu.Unlock()
	h.kick()
}

// Watched reports whether channel has a watcher.
func (h *Hub[E]) Watched(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watches[channel]) > 0
}

// on reports whether channel has a watcher or a listener; h.mu held.
func (h *Hub[E]) on(channel string) bool {
	_, listened := h.listeners[channel]
	return listened || len(h.watches[channel]) > 0
}

// WakeAll wakes every watcher: each works its wait out again (a shard found hung: its
// followers take their flights over; ADR 0023).
func (h *Hub[E]) WakeAll() { h.all(func(*Watch[E]) {}) }

// all runs fn on every watcher, then wakes it.
func (h *Hub[E]) all(fn func(*Watch[E])) {
	h.mu.Lock()
	var ws []*Watch[E]
	for _, set := range h.watches {
		for w := range set {
			ws = append(ws, w)
		}
	}
	h.mu.Unlock()
	for _, w := range ws {
		fn(w)
		w.wake()
	}
}

// each runs fn on every watcher of channel, then wakes it.
func (h *Hub[E]) each(channel string, fn func(*Watch[E])) {
	var buf [4]*Watch[E]
	ws := buf[:0]
	h.mu.Lock()
	for w := range h.watches[channel] {
		ws = append(ws, w)
	}
	h.mu.Unlock()
	for _, w := range ws {
		fn(w)
		w.wake()
	}
}
