package singleflight

import "time"

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

// cachedWithin is cached for a caller that accepts a result no older than maxAge (if
// positive).
func (g *Group) cachedWithin(key string, maxAge time.Duration) (storedResult, bool) {
	sr, ok := g.cached(key)
	if ok && maxAge > 0 && time.Since(sr.at) > maxAge {
		return sr, false
	}
	return sr, ok
}

// keepFor stores a result in this process, made age ago, until it is ttl old, and returns
// its head as kept (annotated). A ttl of zero means Options.ResultTTL. A key purged a
// moment ago is not kept: the result may be the answer of a lookup that ran before the
// purge.
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

// resultTTL is how long res is stored, if its outcome is Store.
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
