package singleflight

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Followers are woken by push. Every script that adds an entry to a flight's stream also
// publishes it on the channel named like the stream (wake.lua), and each process holds one
// pub/sub connection on which its followers' channels are subscribed. So a process waits
// for ten thousand flights over one connection, and sends no command while it waits.
//
// No lost wake-up: a follower subscribes and reads the stream from its position, and
// reads it again when Redis confirms the subscription; every later entry reaches it as a
// message. Redis confirms every subscription again after go-redis reconnects the
// connection, and every confirmation makes the followers of that channel read the stream
// again, so messages lost with a connection are read from the stream. Owners also publish,
// once per heartbeat, that they are alive (aliveChannel): the process records when it last
// heard each owner instance (aliveState), its followers wait as long as that keeps coming,
// and are woken to look their flights up only when a lease passed without it.
//
// The same connection carries the channels a Group listens to for as long as it lives
// (listen), such as purges: one pub/sub connection per process in all.

// wakeHub is a process's pub/sub connection and the followers waiting on it.
type wakeHub struct {
	r *remote

	mu         sync.Mutex
	ps         *redis.PubSub
	watches    map[string]map[*watch]struct{} // channel → its watchers (a set: ten thousand followers may share an alive channel)
	listeners  map[string]listener            // channels subscribed for the Group's life
	subscribed map[string]bool                // channels the sender has subscribed (and not left)
	dirty      map[string]bool                // channels whose watchers changed since the sender looked
	idle       map[string]time.Time           // subscribed channels without watchers, since when (the sender's alone)
	idleOrder  []idleChannel                  // idle's channels in the order they went idle (the sender's alone)
	keepIdle   time.Duration                  // how long an idle channel stays subscribed (h.mu)
	flush      chan struct{}                  // has room for one: dirty has channels
	down       atomic.Bool                    // the connection failed and has not delivered since
	alive      map[string]*aliveState
}

// keepIdleChannels is how long a channel stays subscribed after its last watcher left.
// Leaving is housekeeping: when ten thousand flights end at once, their ten thousand
// unsubscriptions (and Redis's ten thousand confirmations) would be sent and read while the
// answers are being delivered; a moment later they are not in anyone's way. A channel
// watched again meanwhile (the same prompt again) is still subscribed.
const keepIdleChannels = 5 * time.Second

type idleChannel struct {
	channel string
	since   time.Time
}

// listener is what a channel subscribed for the Group's life does with what comes: each
// message, and each confirmation of its subscription (the first, and one after every
// reconnect, when messages may have been lost). Both run on the receiving goroutine.
type listener struct {
	message   func(payload string)
	confirmed func()
}

func newWakeHub(r *remote) *wakeHub {
	return &wakeHub{r: r, watches: map[string]map[*watch]struct{}{}, listeners: map[string]listener{},
		subscribed: map[string]bool{}, dirty: map[string]bool{}, flush: make(chan struct{}, 1),
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

// listenerOf returns channel's listener, if it has one.
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

// start opens the pub/sub connection and its reader, once; h.mu held. It is called by New
// (listen) or by a flight's leader goroutine, which the Group's WaitGroup counts, so adding
// to it is safe.
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

// send subscribes the channels that gained their first watcher and unsubscribes those
// that have had none for keepIdle, each kind in one command, until the Group closes; then
// it closes the connection. One goroutine sends them all, so a channel's subscription and
// unsubscription always reach Redis in the order they were decided.
func (h *wakeHub) send(ps *redis.PubSub) {
	g := h.r.g
	defer g.wg.Done()
	defer ps.Close()
	idleTimer := time.NewTimer(time.Hour) // armed while channels are idle
	idleTimer.Stop()
	for {
		select {
		case <-g.ctx.Done():
			idleTimer.Stop()
			return
		case <-h.flush:
		case <-idleTimer.C:
		}
		var join, leave []string
		now := time.Now()
		h.mu.Lock()
		for ch := range h.dirty {
			switch on := h.on(ch); {
			case on && !h.subscribed[ch]:
				join = append(join, ch)
				h.subscribed[ch] = true
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
			}
		}
		if len(h.idleOrder) > 0 {
			idleTimer.Reset(h.idleOrder[0].since.Add(h.keepIdle).Sub(now))
		}
		h.mu.Unlock()
		// Errors need nothing here: go-redis subscribes every channel again when it
		// reconnects, and the watchers read their streams on the confirmations.
		if len(join) > 0 {
			_ = ps.Subscribe(g.ctx, join...)
		}
		if len(leave) > 0 {
			_ = ps.Unsubscribe(g.ctx, leave...)
		}
	}
}

// watched reports whether channel has a watcher.
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

// receive routes what the connection brings: a confirmed subscription makes its watchers
// read the stream again, a message goes to its channel's watchers.
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
			// Messages may be lost: every follower reads its stream (one whose Redis is
			// down finds out at once, and goes local-only).
			h.down.Store(true)
			h.all(func(w *watch) { w.mu.Lock(); w.resync = true; w.mu.Unlock() })
			// go-redis reconnects and subscribes again on the next Receive; wait a little
			// so that a Redis that is down does not make this a busy loop.
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
