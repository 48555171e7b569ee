package wake

import "sync"

// Watch is one follower's subscription to a channel.
type Watch[E any] struct {
	hub     *Hub[E]
	channel string
	notify  chan struct{} // has room for one: set when there is something to take

	mu     sync.Mutex
	queue  []E      // entries pushed, in order
	resync bool     // (re)subscribed, or the connection broke: read the stream
	gone   []string // tokens the owner said it no longer renews
	hook   func()   // a parked follower's wake-up (see OnWake)
}

// Watch subscribes to channel without waiting: each confirmation sets resync, so nothing
// published before the subscription took effect is missed (ADR 0012).
func (h *Hub[E]) Watch(channel string) (*Watch[E], error) {
	w := &Watch[E]{hub: h, channel: channel, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	if err := h.start(); err != nil {
		h.mu.Unlock()
		return nil, err
	}
	set := h.watches[channel]
	if set == nil {
		set = map[*Watch[E]]struct{}{}
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

// Channel is the channel w watches.
func (w *Watch[E]) Channel() string { return w.channel }

// Notify has a signal, room for one, whenever there is something to Take (or TakeGone, on an
// alive channel); whoever acts on it takes the signal.
func (w *Watch[E]) Notify() <-chan struct{} { return w.notify }

func (w *Watch[E]) wake() {
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

// OnWake sets (or, with nil, clears) what a wake-up runs besides the signal on Notify: a
// parked follower's resumption. It runs on the waking goroutine and must not block.
func (w *Watch[E]) OnWake(fn func()) {
	w.mu.Lock()
	w.hook = fn
	w.mu.Unlock()
}

// mustRead has the watcher read its stream before trusting messages again: it was
// (re)subscribed, or messages may have been lost.
func (w *Watch[E]) mustRead() {
	w.mu.Lock()
	w.resync = true
	w.mu.Unlock()
}

// Take returns whether the stream must be read first, and the entries pushed since.
func (w *Watch[E]) Take() (resync bool, entries []E) {
	w.mu.Lock()
	defer w.mu.Unlock()
	resync, entries = w.resync, w.queue
	w.resync, w.queue = false, nil
	return resync, entries
}

// TakeGone returns the tokens the alive messages said gone since the last call.
func (w *Watch[E]) TakeGone() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	gone := w.gone
	w.gone = nil
	return gone
}

// Close ends the watch; the channel is unsubscribed when it has had no watcher for
// KeepIdle.
func (w *Watch[E]) Close() {
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
	h.dirty[w.channel] = true // the sender leaves it in time (KeepIdle)
	h.mu.Unlock()
	h.kick()
}
