package singleflight

import (
	"strconv"
	"time"
)

// CallOptions are what one caller of DoWith asks for.
type CallOptions struct {
	// NoCache: a stored result is not served; an upstream call in flight is still joined.
	NoCache bool
	// MaxAge, if positive, accepts a stored result no older than this (HTTP's max-age). A
	// caller with a MaxAge joins an upstream call in flight, never a flight that may serve
	// an older stored result.
	MaxAge time.Duration
	// Route and Model describe the call in the flights listing (see Group.Flights). They
	// are stored with the flight's meta in Redis, so they must not hold secrets.
	Route, Model string
	// Inline is for a caller that reads the answer only once it is whole: if it starts the
	// flight, DoWith leads it on the caller's goroutine, and returns once the flight has
	// ended or waits on another instance's owner (then, as always, in Reader.Next), so
	// that an owned flight costs no goroutine of its own. When its call fails while others
	// wait with it, DoWith returns with that answer, and the retries for the others go on
	// on a goroutine of their own. The owner function must not wait
	// for this caller to read (it has not started to).
	Inline bool
}

// joinableWith is joinable for a caller with CallOptions; g.mu held. A caller with a
// MaxAge joins a flight whose role is decided as owner or follower (its answer will be
// fresh), a no-cache flight, or a flight of callers with the same MaxAge.
func (g *Group) joinableWith(key string, o CallOptions) (*flight, string) {
	if o.MaxAge <= 0 || o.NoCache {
		return g.joinable(key, o.NoCache)
	}
	mk := key + "\x00maxage=" + strconv.FormatInt(o.MaxAge.Milliseconds(), 10)
	for _, lk := range []string{key, key + "\x00nocache", mk} {
		f := g.flights[lk]
		if f == nil || f.hasEnded() {
			continue
		}
		if lk == mk || f.noCache {
			return f, lk
		}
		f.mu.Lock()
		fresh := f.role == RoleOwner || f.role == RoleFollower
		f.mu.Unlock()
		if fresh {
			return f, lk
		}
	}
	return nil, mk
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
