package singleflight

import (
	"bytes"
	"time"
)

type storedResult struct {
	head Head
	body []byte
	at   time.Time     // monotonic: age and expiry never depend on wall-clock steps
	ttl  time.Duration // kept until at+ttl
}

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

func (g *Group) keep(key string, head Head, body []byte, age time.Duration) {
	g.keepFor(key, head, body, age, g.opts.ResultTTL)
}

// cachedWithin is cached for a caller that accepts no result older than a positive maxAge.
func (g *Group) cachedWithin(key string, maxAge time.Duration) (storedResult, bool) {
	sr, ok := g.cached(key)
	if ok && maxAge > 0 && time.Since(sr.at) > maxAge {
		return sr, false
	}
	return sr, ok
}

// keepFor keeps a result made age ago until it is ttl old, unless just purged (ADR 0046).
func (g *Group) keepFor(key string, head Head, body []byte, age, ttl time.Duration) Head {
	if ttl == 0 {
		ttl = g.opts.ResultTTL
	}
	if ttl <= age || g.recentlyPurged(key) {
		return head
	}
	if g.opts.Annotate != nil && head.Note == nil {
		head.Note = g.opts.Annotate(head, body)
	}
	g.cacheMu.Lock()
	defer g.cacheMu.Unlock()
	g.cache.add(key, storedResult{head: head, body: body, at: time.Now().Add(-age), ttl: ttl})
	return head
}

// forgetKept drops key's answer kept here if it is body: an answer whose final write was
// fenced is not the flight's, which another owner ended (ADR 0027: its local readers got
// it; callers after the refusal get the flight's). It was kept before the write, so a
// caller here between the two gets it: the write's refusal is not known before.
func (g *Group) forgetKept(key string, body []byte) {
	g.cacheMu.Lock()
	defer g.cacheMu.Unlock()
	if sr, ok := g.cache.get(key); ok && bytes.Equal(sr.body, body) {
		g.cache.remove(key)
	}
}

func (g *Group) resultTTL(res Result) time.Duration {
	if res.TTL > 0 {
		return res.TTL
	}
	return g.opts.ResultTTL
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
