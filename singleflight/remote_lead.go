package singleflight

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// position is where a follower is in the stream of the generation it follows.
type position struct {
	token   string
	last    string // ID of the last entry read
	n       int    // batch number expected next
	attempt int
	lost    bool // entries of this generation are missing: only its end matters
}

// switchTo starts following the generation of the owner d names, from its first entry.
func (p *position) switchTo(f *flight, d decision) {
	f.startGen(RoleFollower, false)
	*p = position{token: d.token, last: d.gen, n: 1, attempt: d.attempt}
}

// serveHit ends f with the stored answer d found, and keeps it in this process. A flight
// that was following the attempt that stored it finishes that same answer: its readers go
// on from where they are. One that followed another attempt gives that generation up for
// it; one that followed nothing is a hit.
func (r *remote) serveHit(f *flight, d decision, pos *position) {
	r.g.keepFor(f.key, d.head, d.body, d.age, d.ttl)
	switch {
	case pos.token == "":
		f.finishHit(d.head, d.body, d.age)
	case d.token != pos.token || !f.continueWith(d.head, d.body):
		f.finishWith(d.head, d.body)
	}
}

// lead runs one local flight against Redis: look up, then serve a hit, follow the owner,
// or claim and own; after a failed or expired attempt, contend again after a jitter.
func (r *remote) lead(ctx context.Context, f *flight) {
	g := r.g
	var (
		pos         position
		last        Result // the last failed response seen, for when no attempt is left
		failures    int    // failed attempts this flight saw (releases at shutdown excepted)
		fresh       = true // this flight has not yet seen an attempt of its key
		contended   bool   // the jitter before a takeover was waited
		reason      string // why we contend
		decided     bool
		streamTried bool // read the stream for a finished newer attempt
		local       bool // a Redis command failed: serve this flight in-process
	)
	role := func(ro Role) {
		if !decided {
			decided = true
			g.observe(Event{Kind: EventRole, Key: f.key, Role: ro})
		}
	}
	// gaveUp reports whether the attempts are used up: by the flight's count in Redis or,
	// when new callers keep restarting that count, by what this flight itself saw.
	gaveUp := func(attempt int) bool {
		return attempt >= g.opts.MaxAttempts || failures >= g.opts.MaxAttempts
	}
	for ctx.Err() == nil {
		if local || r.degradedFor(f.key) {
			g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: "degraded"})
			role(RoleOwner)
			g.leadLocal(ctx, f, failures+1)
			return
		}
		// A flight that has followed nothing yet offers a token: if the key is free, the
		// lookup claims it in the same round trip.
		var (
			candidate string
			err       error
		)
		if pos.last == "" || streamTried {
			candidate = r.newToken(ctx)
		}
		d, err := r.lookup(ctx, f.key, f.noCache, candidate, f.call)
		if err != nil {
			local = true
			continue
		}
		var (
			token string // of the attempt to own, from lookup or claim
			c     decision
		)
		if d.kind == "owner" {
			token, c = candidate, d
			goto own
		}
	decide:
		switch d.kind {
		case "hit":
			role(RoleHit)
			r.serveHit(f, d, &pos)
			return
		case "follow":
			role(RoleFollower)
			if d.token != pos.token {
				pos.switchTo(f, d)
			}
			end := r.follow(ctx, f, &pos, d.remaining)
			switch end.kind {
			case followDone:
				return
			case followRedisErr:
				local = true
				continue
			case followLost:
				// Take the stored answer if there is one, else call again.
				fresh, contended, streamTried = false, true, true
				continue
			case followFailed:
				last, reason = end.res, "failed"
				if end.reason == "shutdown" {
					reason = "shutdown"
				} else {
					failures++
					if gaveUp(pos.attempt) {
						g.deliverLastError(f, last)
						return
					}
				}
			case followExpired:
				reason = "expired"
			}
			fresh = false
			if !f.canUseNewGen() || !g.jitter(ctx) {
				return
			}
			contended = true
		case "claim":
			if d.reason == "done" && pos.last != "" && !streamTried {
				// The attempt we waited for was followed by one that already finished:
				// its entries are in the stream after our position.
				streamTried = true
				switch end := r.follow(ctx, f, &pos, 0); end.kind {
				case followDone:
					return
				case followRedisErr:
					local = true
				}
				continue
			}
			if (d.reason == "expired" || d.reason == "failed") && !contended {
				// Someone else's attempt ended: wait the jitter, then look again, so
				// that of all contenders the first to wake wins and the rest follow.
				if reason == "" {
					reason = d.reason
				}
				if !g.jitter(ctx) {
					return
				}
				contended = true
				continue
			}
			token = r.newToken(ctx)
			if g.hooks.beforeClaim != nil {
				g.hooks.beforeClaim()
			}
			c, err = r.claim(ctx, f.key, token, d, fresh, f.call)
			if err != nil {
				local = true
				continue
			}
			contended = false
			switch c.kind {
			case "follow":
				d = c
				goto decide
			case "changed":
				continue
			case "exhausted":
				g.deliverLastError(f, last)
				return
			}
			goto own
		}
		continue
	own:
		{
			role(RoleOwner)
			if d.reason == "expired" || d.reason == "failed" || reason != "" {
				g.observe(Event{Kind: EventTakeover, Key: f.key, Reason: orDefault(reason, d.reason)})
			}
			reason, fresh = "", false
			pos = position{token: token}
			c.token = token
			o := newRemoteOwnership(r, f.key, c)
			end, res, _ := g.own(ctx, f, o)
			switch end {
			case attemptDone:
				return
			case attemptLeaseLost:
				if !f.canUseNewGen() {
					return // nobody here can use the new owner's answer
				}
				continue // follow whoever owns it now
			}
			last = res
			failures++
			if ctx.Err() != nil || !g.retryAfterFailure(ctx, f, max(c.attempt, failures), last) {
				return
			}
			reason, contended = "failed", true
		}
	}
}

func orDefault(s, d string) string {
	if s != "" {
		return s
	}
	return d
}

type followKind uint8

const (
	followDone     followKind = iota // the flight has its response
	followFailed                     // the attempt failed; res is its response
	followExpired                    // the owner's lease ran out, or its meta is gone
	followRedisErr                   // Redis does not answer
	followLost                       // the attempt ended, but its entries could not all be read
)

type followEnd struct {
	kind   followKind
	res    Result
	reason string
	err    error
}

// follow reads the owner's stream into f until the attempt ends. It blocks on XREAD from
// the concrete ID it last read (never "$"), so no entry written since the lookup can be
// missed; each block is bounded by the lease, after which the meta is checked again.
func (r *remote) follow(ctx context.Context, f *flight, pos *position, remaining time.Duration) followEnd {
	start := time.Now()
	defer func() { r.g.observe(Event{Kind: EventWait, Key: f.key, Duration: time.Since(start)}) }()
	k := r.keys(f.key)
	deadline := time.Now().Add(remaining) // of this read: the lease's end, or sooner to re-read
	leaseEnd := deadline                  // when the owner's lease runs out, as far as we know
	recheck := 0
	if r.g.hooks.beforeFollow != nil {
		r.g.hooks.beforeFollow()
	}
	for {
		block := min(max(time.Until(deadline)+20*time.Millisecond, 20*time.Millisecond), r.maxBlock)
		streams, err := r.block.XRead(ctx, &redis.XReadArgs{Streams: []string{k.stream, pos.last}, Count: 512, Block: block}).Result()
		if ctx.Err() != nil {
			return followEnd{kind: followDone}
		}
		if err != nil {
			if !errors.Is(err, redis.Nil) {
				r.redisErr("xread", f.key, err) // e.g. UNBLOCKED or MOVED by a failover: check again
			}
			if r.g.hooks.readGap != nil {
				r.g.hooks.readGap()
			}
			d, lerr := r.lookup(ctx, f.key, f.noCache, "", f.call)
			if lerr != nil {
				return followEnd{kind: followRedisErr, err: lerr}
			}
			switch {
			case d.kind == "follow" && d.token == pos.token:
				deadline, recheck = time.Now().Add(d.remaining), 0
				leaseEnd = deadline
				continue
			case d.kind == "claim" && d.reason == "absent" && time.Now().Before(leaseEnd):
				// Redis lost the flight (a restart without persistence, a failover): its
				// owner puts it back with its next write while its lease runs (restore.lua).
				// Until the lease would have run out, that is worth waiting for.
				deadline = leaseEnd
				continue
			case d.kind == "hit" && d.token == pos.token:
				r.serveHit(f, d, pos) // our attempt's own answer: readers go on where they are
				return followEnd{kind: followDone}
			case d.kind == "claim" && d.reason == "expired" && d.token == pos.token:
				return followEnd{kind: followExpired}
			case recheck < 2:
				// Our attempt ended, or another began. The stream says which, in order:
				// read what follows our position before believing the meta. An attempt
				// that finished wrote its end before any later generation's first entry.
				recheck++
				deadline = time.Now()
				continue
			}
			switch d.kind {
			case "hit": // our attempt's entries are gone (trimmed, or lost with a failover)
				r.serveHit(f, d, pos)
				return followEnd{kind: followDone}
			case "follow":
				pos.switchTo(f, d)
				deadline, recheck = time.Now().Add(d.remaining), 0
				leaseEnd = deadline
				continue
			}
			return followEnd{kind: followExpired}
		}
		for _, s := range streams {
			for _, m := range s.Messages {
				if end, ok := r.apply(f, pos, m); ok {
					return end
				}
			}
		}
		if r.g.hooks.afterEntries != nil {
			r.g.hooks.afterEntries()
		}
		// The owner is alive and writing.
		deadline, recheck = time.Now().Add(r.g.opts.LeaseTTL), 0
		leaseEnd = deadline
	}
}

// apply feeds one stream entry to f; ok when the attempt ended.
func (r *remote) apply(f *flight, pos *position, m redis.XMessage) (followEnd, bool) {
	pos.last = m.ID
	t, _ := m.Values["t"].(string)
	tok, _ := m.Values["tok"].(string)
	if tok != pos.token {
		if t == "gen" { // a takeover: a new generation starts here
			f.startGen(RoleFollower, false)
			a, _ := strconv.Atoi(val(m, "a"))
			pos.token, pos.n, pos.attempt, pos.lost = tok, 1, a, false
		}
		return followEnd{}, false
	}
	if t == "gen" {
		return followEnd{}, false
	}
	n, _ := strconv.Atoi(val(m, "n"))
	if n != pos.n && !pos.lost {
		// Entries are missing (trimmed): this generation cannot be streamed. Wait for its
		// end, then finish from the stored answer (readers go on where they are) or give
		// the generation up and call again.
		pos.lost = true
	}
	pos.n = n + 1
	if pos.lost {
		switch t {
		case "done":
			return followEnd{kind: followLost}, true
		case "failed":
			return followEnd{kind: followFailed, reason: val(m, "r")}, true
		}
		return followEnd{}, false
	}
	var head *Head
	if s := val(m, "s"); s != "" {
		h, err := decodeHead(s, val(m, "h"))
		if err == nil {
			head = &h
		}
	}
	data := []byte(val(m, "d"))
	switch t {
	case "chunk":
		if head != nil {
			f.setHead(*head)
		}
		f.appendChunk(data)
	case "done":
		if head == nil {
			head = &Head{Status: 200}
		}
		f.finish(*head, data)
		return followEnd{kind: followDone}, true
	case "failed":
		res := Result{Outcome: Retry, Body: data}
		if head != nil {
			res.Head = *head
		}
		f.resetGen(nil)
		return followEnd{kind: followFailed, res: res, reason: val(m, "r")}, true
	}
	return followEnd{}, false
}

func val(m redis.XMessage, k string) string {
	s, _ := m.Values[k].(string)
	return s
}
