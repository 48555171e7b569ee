package wake

import (
	"strings"
	"time"
)

// aliveState is what a process heard on an alive channel: a message moves until and wakes
// nobody; silent wakes the watchers when a lease passes without one (ADRs 0009, 0057).
// Written by the receiver (Heard) under Hub.mu; its timer, started there, wakes the
// channel's watchers on a goroutine of its own; the last watcher's Close stops it.
type aliveState struct {
	until  time.Time // a lease after the last alive message
	silent *time.Timer
	// unrenewed: tokens whose renewal the messages say failed, each with the until of the
	// last message that did not say so (ADR 0057).
	unrenewed map[string]time.Time
}

// UnrenewedMark marks a token of an alive message whose last renewal failed.
const UnrenewedMark = "~"

// AliveChannel is where instance publishes that it renewed its leases.
func (h *Hub[E]) AliveChannel(instance string) string { return h.cfg.AlivePrefix + instance }

// Heard records an alive message on channel, the receiver's part (tests call it too): the
// tokens said gone, and those newly unrenewed, wake its watchers; the others wake nobody.
func (h *Hub[E]) Heard(channel string, tokens []string) {
	lease := h.cfg.Lease
	var gone []string
	unrenewed := map[string]bool{}
	for _, t := range tokens {
		if s, ok := strings.CutPrefix(t, UnrenewedMark); ok {
			unrenewed[s] = true
		} else {
			gone = append(gone, t)
		}
	}
	newlyUnrenewed := false
	h.mu.Lock()
	if len(h.watches[channel]) > 0 {
		// until first: the timer then fires no sooner, and its watchers find it passed.
		st := h.alive[channel]
		if st == nil {
			st = &aliveState{until: time.Now().Add(lease), unrenewed: map[string]time.Time{}}
			st.silent = time.AfterFunc(lease, func() { h.each(channel, func(*Watch[E]) {}) })
			h.alive[channel] = st
		}
		was := st.until
		for t := range st.unrenewed {
			if !unrenewed[t] {
				delete(st.unrenewed, t) // renewed again
			}
		}
		for t := range unrenewed {
			if _, ok := st.unrenewed[t]; !ok {
				st.unrenewed[t], newlyUnrenewed = was, true
			}
		}
		st.until = time.Now().Add(lease)
		st.silent.Reset(lease)
	}
	h.mu.Unlock()
	// Followers parked on the messages work their wait out again, told of tokens said gone.
	if newlyUnrenewed || len(gone) > 0 {
		h.each(channel, func(w *Watch[E]) {
			if len(gone) > 0 {
				w.mu.Lock()
				w.gone = append(w.gone, gone...)
				w.mu.Unlock()
			}
		})
	}
	if h.cfg.Heard != nil {
		h.cfg.Heard()
	}
}

// AliveUntil is a lease after the last alive message heard on channel that did not say
// token's renewal failed, or zero; moving says it is the last message's, which the next
// one moves on.
func (h *Hub[E]) AliveUntil(channel, token string) (until time.Time, moving bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.alive[channel]
	if st == nil {
		return time.Time{}, false
	}
	if until, ok := st.unrenewed[token]; ok {
		return until, false
	}
	return st.until, true
}
