package singleflight

import "time"

// aliveState is what a process heard on an alive channel: a message moves until and wakes
// nobody; silent wakes the watchers when a lease passes without one (ADR 0009).
type aliveState struct {
	until  time.Time // a lease after the last alive message
	silent *time.Timer
}

// aliveChannel is where the owner instance id publishes that it renewed its leases.
func (h *wakeHub) aliveChannel(instance string) string {
	return h.r.g.opts.KeyPrefix + ":alive:" + instance
}

// heard records an alive message on channel; the tokens gone wake its watchers.
func (h *wakeHub) heard(channel string, gone []string) {
	lease := h.r.g.opts.LeaseTTL
	h.mu.Lock()
	if len(h.watches[channel]) > 0 {
		// until first: the timer then fires no sooner, and its watchers find it passed.
		st := h.alive[channel]
		if st == nil {
			st = &aliveState{until: time.Now().Add(lease)}
			st.silent = time.AfterFunc(lease, func() { h.each(channel, func(*watch) {}) })
			h.alive[channel] = st
		} else {
			st.until = time.Now().Add(lease)
			st.silent.Reset(lease)
		}
	}
	h.mu.Unlock()
	if len(gone) > 0 {
		h.each(channel, func(w *watch) { w.mu.Lock(); w.gone = append(w.gone, gone...); w.mu.Unlock() })
	}
	if h.r.g.hooks.aliveHeard != nil {
		h.r.g.hooks.aliveHeard()
	}
}

// aliveUntil is a lease after the last alive message heard on channel, or zero.
func (h *wakeHub) aliveUntil(channel string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.alive[channel]; st != nil {
		return st.until
	}
	return time.Time{}
}
