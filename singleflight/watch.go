package singleflight

import "sync"

// watch is one follower's subscription to a channel.
type watch struct {
	hub     *wakeHub
	channel string
	notify  chan struct{} // has room for one: set when there is something to take

	mu     sync.Mutex
	queue  []entry  // entries pushed, in order
	resync bool     // (re)subscribed, or the connection broke: read the stream
	gone   []string // tokens the owner said it no longer renews
	hook   func()   // a parked follower's wake-up (see park)
}

// watch subscribes to channel without waiting: each confirmation sets resync, so nothing
// published before the subscription took effect is missed (ADR 0012).
func (h *wakeHub) watch(channel string) (*watch, error) {
	w := &watch{hub: h, channel: channel, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	if err := h.start(); err != nil {
		h.mu.Unlock()
		return nil, err
	}
	set := h.watches[channel]
	if set == nil {
		set = map[*watch]struct{}{}
		h.watches[channel] = set
	}
	set[w] = struct{}{}
	subscribed := h.subscribed[channel]
	if !subscribed {
		h.dirty[channel] = true
	}
	h.mu.Unlock()
	if subscribed {
		w.mu.Lock()
		w.resync = true // already subscribed: read, then trust messages
		w.mu.Unlock()
		w.wake()
	} else {
		h.kick()
	}
	return w, nil
}

func (w *watch) wake() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
	w.mu.Lock()
	hook := w.hook
	w.mu.Unlock()
	if hook != nil {
		hook()
	}
}

// setHook sets (or, with nil, clears) what wakes a parked follower of w.
func (w *watch) setHook(fn func()) {
	w.mu.Lock()
	w.hook = fn
	w.mu.Unlock()
}

// take returns whether the stream must be read first, and the entries pushed since.
func (w *watch) take() (resync bool, entries []entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	resync, entries = w.resync, w.queue
	w.resync, w.queue = false, nil
	return resync, entries
}

func (w *watch) takeGone() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	gone := w.gone
	w.gone = nil
	return gone
}

// close ends the watch; the channel is unsubscribed when it has had no watcher for keepIdle.
func (w *watch) close() {
	h := w.hub
	h.mu.Lock()
	set := h.watches[w.channel]
	delete(set, w)
	if len(set) > 0 {
		h.mu.Unlock()
		return
	}
	delete(h.watches, w.channel)
	if st := h.alive[w.channel]; st != nil {
		st.silent.Stop()
		delete(h.alive, w.channel)
	}
	h.dirty[w.channel] = true // the sender leaves it in time (keepIdleChannels)
	h.mu.Unlock()
	h.kick()
}
