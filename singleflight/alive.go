package singleflight

import (
	"strings"
	"time"
)

// aliveState is what a process heard on an alive channel: a message moves until and wakes
// nobody; silent wakes the watchers when a lease passes without one (ADRs 0009, 0057).
type aliveState struct {
	until  time.Time // a lease after the last alive message
	silent *time.Timer
	// stale: tokens whose renewal the messages say failed, each with the until of the
	// last message that did not say so (ADR 0057).
	stale map[string]time.Time
}

// staleMark marks a token of an alive message whose last renewal failed.
const staleMark = "~"

// aliveChannel is where the owner instance id publishes that it renewed its leases.
func (h *wakeHub) aliveChannel(instance string) string {
	return h.r.g.opts.KeyPrefix + ":alive:" + instance
}

// heard records an alive message on channel; the tokens gone, and those newly stale, wake
// its watchers.
func (h *wakeHub) heard(channel string, tokens []string) {
	lease := h.r.g.opts.LeaseTTL
	var gone []string
	stale := map[string]bool{}
	for _, t := range tokens {
		if s, ok := strings.CutPrefix(t, staleMark); ok {
			stale[s] = true
		} else {
			gone = append(gone, t)
		}
	}
	newlyStale := false
	h.mu.Lock()
	if len(h.watches[channel]) > 0 {
		// until first: the timer then fires no sooner, and its watchers find it passed.
		st := h.alive[channel]
		if st == nil {
			st = &aliveState{until: time.Now().Add(lease), stale: map[string]time.Time{}}
			st.silent = time.AfterFunc(lease, func() { h.each(channel, func(*watch) {}) })
			h.alive[channel] = st
		}
		was := st.until
		for t := range st.stale {
			if !stale[t] {
				delete(st.stale, t) // renewed again
			}
		}
		for t := range stale {
			if _, ok := st.stale[t]; !ok {
				st.stale[t], newlyStale = was, true
			}
		}
		st.until = time.Now().Add(lease)
		st.silent.Reset(lease)
	}
	h.mu.Unlock()
	// Followers parked on the messages work their wait out again, told of tokens said gone.
	if newlyStale || len(gone) > 0 {
		h.each(channel, func(w *watch) {
			if len(gone) > 0 {
				w.mu.Lock()
				w.gone = append(w.gone, gone...)
				w.mu.Unlock()
			}
		})
	}
	if h.r.g.hooks.aliveHeard != nil {
		h.r.g.hooks.aliveHeard()
	}
}

// aliveUntil is a lease after the last alive message heard on channel that did not say
// token's renewal failed, or zero; moving says it is the last message's, which the next
// one moves on.
func (h *wakeHub) aliveUntil(channel, token string) (until time.Time, moving bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.alive[channel]
	if st == nil {
		return time.Time{}, false
	}
	if until, ok := st.stale[token]; ok {
		return until, false
	}
	return st.until, true
}
