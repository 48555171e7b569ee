package singleflight

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// wakeHub is a process's one pub/sub connection, for its followers and its listeners.
// Every confirmation of a subscription makes its watchers read the stream. See ADR 0012.
type wakeHub struct {
	r *remote

	mu         sync.Mutex
	ps         *redis.PubSub
	watches    map[string]map[*watch]struct{} // channel → its watchers (a set: many followers share an alive channel)
	listeners  map[string]listener            // channels subscribed for the Group's life
	subscribed map[string]bool                // channels the sender has subscribed (and not left)
	pending    map[string]unconfirmed         // subscribed channels Redis has not confirmed (since it broke)
	dirty      map[string]bool                // channels whose watchers changed since the sender looked
	idle       map[string]time.Time           // subscribed channels without watchers, since when (the sender's alone)
	idleOrder  []idleChannel                  // idle's channels in the order they went idle (the sender's alone)
	keepIdle   time.Duration                  // how long an idle channel stays subscribed (h.mu)
	flush      chan struct{}                  // has room for one: dirty has channels
	down       atomic.Bool                    // the connection failed and has not delivered since
	alive      map[string]*aliveState
}

// keepIdleChannels is how long a channel stays subscribed without watchers (ADR 0014).
const keepIdleChannels = 5 * time.Second

// confirmWithin is how long a SUBSCRIBE may go unconfirmed before it is sent again: a
// subscription holds only once Redis confirmed it (ADR 0055).
const confirmWithin = time.Second

type unconfirmed struct{ since, sent time.Time } // sent: when SUBSCRIBE was last sent

type idleChannel struct {
	channel string
	since   time.Time
}

// listener handles a channel subscribed for the Group's life, on the receiving goroutine.
type listener struct {
	message   func(payload string)
	confirmed func()
}

func newWakeHub(r *remote) *wakeHub {
	return &wakeHub{r: r, watches: map[string]map[*watch]struct{}{}, listeners: map[string]listener{},
		subscribed: map[string]bool{}, pending: map[string]unconfirmed{}, dirty: map[string]bool{}, flush: make(chan struct{}, 1),
		alive: map[string]*aliveState{}, idle: map[string]time.Time{}, keepIdle: keepIdleChannels}
}

// listen subscribes channel for as long as the Group lives.
func (h *wakeHub) listen(channel string, l listener) error {
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

func (h *wakeHub) listenerOf(channel string) (listener, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.listeners[channel]
	return l, ok
}

func (h *wakeHub) kick() {
	select {
	case h.flush <- struct{}{}:
	default:
	}
}

// start opens the connection once; h.mu held. Its callers are counted by the Group's
// WaitGroup, or are New: adding to it is safe.
func (h *wakeHub) start() error {
	if h.ps != nil {
		return nil
	}
	g := h.r.g
	if g.ctx.Err() != nil {
		return ErrClosed
	}
	g.wg.Add(2)
	h.ps = h.r.rdb.Subscribe(g.ctx)
	ps := h.ps
	go h.send(ps)
	go h.receive(ps)
	return nil
}

// send subscribes and unsubscribes channels, one command each. It alone sends them, so a
// channel's subscription and unsubscription reach Redis in the order they were decided.
func (h *wakeHub) send(ps *redis.PubSub) {
	g := h.r.g
	defer g.wg.Done()
	defer ps.Close()
	timer := time.NewTimer(time.Hour) // armed while channels are idle or unconfirmed
	timer.Stop()
	for {
		select {
		case <-g.ctx.Done():
			timer.Stop()
			return
		case <-h.flush:
		case <-timer.C:
		}
		h.mu.Lock()
		sent := g.hooks.subscribed // set by tests under h.mu
		join, leave, next := h.plan(time.Now())
		h.mu.Unlock()
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		if len(join) > 0 {
			err := ps.Subscribe(g.ctx, join...)
			if sent != nil {
				sent(join, err)
			}
			if err != nil {
				// go-redis may have reconnected inside it without these channels: send
				// them again soon, whatever it says.
				h.mu.Lock()
				for _, ch := range join {
					if p, ok := h.pending[ch]; ok {
						p.sent = time.Now().Add(pollEvery - confirmWithin)
						h.pending[ch] = p
					}
				}
				h.mu.Unlock()
				timer.Reset(pollEvery)
			}
		}
		if len(leave) > 0 {
			_ = ps.Unsubscribe(g.ctx, leave...)
		}
	}
}

// plan returns the channels to subscribe (new, or unconfirmed for confirmWithin) and to
// leave (idle for keepIdle), and when to look again; h.mu held.
func (h *wakeHub) plan(now time.Time) (join, leave []string, next time.Time) {
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
		if due := p.sent.Add(confirmWithin); !due.After(now) {
			join = append(join, ch)
			p.sent = now
			h.pending[ch] = p
		} else if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	if len(join) > 0 && (next.IsZero() || now.Add(confirmWithin).Before(next)) {
		next = now.Add(confirmWithin)
	}
	return join, leave, next
}

// unconfirmedSince is when channel's subscription stopped being known to hold: zero while
// Redis has confirmed it and the connection has not broken since; now for a channel not
// subscribed yet.
func (h *wakeHub) unconfirmedSince(channel string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.subscribed[channel] {
		return time.Now()
	}
	return h.pending[channel].since
}

// unconfirm takes every subscription for unconfirmed: the connection broke, and go-redis
// subscribes again when it reconnects. One that Redis does not confirm is sent again.
func (h *wakeHub) unconfirm() {
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

func (h *wakeHub) watched(channel string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watches[channel]) > 0
}

// on reports whether channel has a watcher or a listener; h.mu held.
func (h *wakeHub) on(channel string) bool {
	_, listened := h.listeners[channel]
	return listened || len(h.watches[channel]) > 0
}

// receive routes what the connection brings to the channel's listener or watchers.
func (h *wakeHub) receive(ps *redis.PubSub) {
	g := h.r.g
	defer g.wg.Done()
	backoff := 10 * time.Millisecond
	for {
		v, err := ps.Receive(g.ctx)
		if g.ctx.Err() != nil {
			return
		}
		if err != nil {
			g.observe(Event{Kind: EventRedisError, Op: "subscribe", Err: err})
			// Messages may be lost: every follower reads its stream.
			h.down.Store(true)
			h.unconfirm()
			h.all(func(w *watch) { w.mu.Lock(); w.resync = true; w.mu.Unlock() })
			// go-redis reconnects on the next Receive; back off, not a busy loop.
			if !sleep(g.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		h.down.Store(false)
		switch m := v.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			h.mu.Lock()
			delete(h.pending, m.Channel)
			h.mu.Unlock()
			if l, ok := h.listenerOf(m.Channel); ok {
				l.confirmed()
				continue
			}
			h.each(m.Channel, func(w *watch) { w.mu.Lock(); w.resync = true; w.mu.Unlock() })
		case *redis.Message:
			if l, ok := h.listenerOf(m.Channel); ok {
				l.message(m.Payload)
				continue
			}
			if strings.HasPrefix(m.Channel, h.r.g.opts.KeyPrefix+":alive:") {
				h.heard(m.Channel, strings.Fields(m.Payload))
				continue
			}
			if !h.watched(m.Channel) {
				continue // an idle channel, still subscribed (see keepIdleChannels)
			}
			e, ok := decodeEntry(m.Payload)
			if !ok {
				h.each(m.Channel, func(w *watch) { w.mu.Lock(); w.resync = true; w.mu.Unlock() })
				continue
			}
			h.each(m.Channel, func(w *watch) { w.mu.Lock(); w.queue = append(w.queue, e); w.mu.Unlock() })
		}
	}
}

// all runs fn on every watcher, then wakes it.
func (h *wakeHub) all(fn func(*watch)) {
	h.mu.Lock()
	var ws []*watch
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
func (h *wakeHub) each(channel string, fn func(*watch)) {
	var buf [4]*watch
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
