package singleflight

import "strconv"

// joinableWith is joinable for a caller with CallOptions; g.mu held. A caller with a
// MaxAge joins an owned or followed flight, a no-cache one, or one of its MaxAge (ADR 0048).
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

// joinable returns the local flight a caller of key joins, or nil and the map key to start
// one under; g.mu held. No-cache joins no flight that may serve a stored result (ADR 0048).
func (g *Group) joinable(key string, noCache bool) (*flight, string) {
	usable := func(f *flight) bool {
		if f == nil || f.hasEnded() {
			return false // its outcome is out: a caller arriving now starts anew
		}
		if !noCache || f.noCache {
			return true
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.role == RoleOwner || f.role == RoleFollower
	}
	if f := g.flights[key]; usable(f) {
		return f, key
	}
	// Made on the stack: every hit and every owner looks this map key up.
	var buf [128]byte
	nc := append(append(buf[:0], key...), "\x00nocache"...)
	if f := g.flights[string(nc)]; usable(f) {
		return f, string(nc)
	}
	if noCache {
		return nil, string(nc)
	}
	return nil, key
}
