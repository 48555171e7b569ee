package singleflight

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// entryKind is a stream entry's "t" field (xadd in wake.lua). See ADR 0004.
type entryKind uint8

const (
	entryUnknown entryKind = iota
	entryGen               // a generation (attempt) begins: tok, a
	entryChunk             // streamed bytes: tok, n, d; the first also s, h
	entryDone              // the attempt's answer ends: tok, n, s, h, d, landed
	entryFailed            // the attempt failed: tok, n, s, h, d, r
)

var entryKindOf = map[string]entryKind{"gen": entryGen, "chunk": entryChunk, "done": entryDone, "failed": entryFailed}

type entry struct {
	id       string
	kind     entryKind
	token    string // of the attempt that wrote it
	n        int    // batch number
	attempt  int    // gen
	status   string // with header: the answer's head, on the first chunk and on done
	header   string
	data     string
	landed   int64 // done: when complete ran, Redis's clock in µs (see answered.go)
	shutdown bool  // failed: its owner released the flight at shutdown
	unsent   bool  // published without its data (x=1): read it from the stream
}

func (e *entry) set(k, v string) {
	switch k {
	case "t":
		e.kind = entryKindOf[v]
	case "tok":
		e.token = v
	case "n":
		e.n, _ = strconv.Atoi(v)
	case "a":
		e.attempt, _ = strconv.Atoi(v)
	case "s":
		e.status = v
	case "h":
		e.header = v
	case "d":
		e.data = v
	case "landed":
		e.landed, _ = strconv.ParseInt(v, 10, 64)
	case "r":
		e.shutdown = v == "shutdown"
	case "x":
		e.unsent = v == "1"
	}
}

func (e *entry) head() *Head {
	if e.status == "" {
		return nil
	}
	h, err := decodeHead(e.status, e.header)
	if err != nil {
		return nil
	}
	return &h
}

func entryOf(m redis.XMessage) entry {
	e := entry{id: m.ID}
	for k, v := range m.Values {
		s, _ := v.(string)
		e.set(k, s)
	}
	return e
}

// decodeEntry parses a message of wake.lua; false for one published without its data.
func decodeEntry(p string) (entry, bool) {
	next := func() (string, bool) {
		i := strings.IndexByte(p, ':')
		if i < 0 {
			return "", false
		}
		n, err := strconv.Atoi(p[:i])
		if err != nil || n < 0 || n > len(p)-i-1 {
			return "", false
		}
		s := p[i+1 : i+1+n]
		p = p[i+1+n:]
		return s, true
	}
	id, ok := next()
	if !ok {
		return entry{}, false
	}
	e := entry{id: id}
	for p != "" {
		k, ok1 := next()
		v, ok2 := next()
		if !ok1 || !ok2 {
			return entry{}, false
		}
		e.set(k, v)
	}
	return e, !e.unsent
}

// readAfter reads the entries of stream after id, without blocking.
func (r *remote) readAfter(ctx context.Context, stream, id string) ([]entry, error) {
	var out []entry
	for {
		octx, cancel := r.watchedOp(ctx, stream)
		streams, err := r.rdb.XRead(octx, &redis.XReadArgs{Streams: []string{stream, id}, Count: 512, Block: -1}).Result()
		cancel()
		if errors.Is(err, redis.Nil) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		n := 0
		for _, s := range streams {
			for _, m := range s.Messages {
				out = append(out, entryOf(m))
			}
			n += len(s.Messages)
			if len(s.Messages) > 0 {
				id = s.Messages[len(s.Messages)-1].ID
			}
		}
		if n < 512 {
			return out, nil
		}
	}
}

// afterID reports whether stream ID a comes after b ("ms-seq" each; "" before all).
func afterID(a, b string) bool {
	if b == "" {
		return true
	}
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	ami, _ := strconv.ParseUint(am, 10, 64)
	bmi, _ := strconv.ParseUint(bm, 10, 64)
	if ami != bmi {
		return ami > bmi
	}
	asi, _ := strconv.ParseUint(as, 10, 64)
	bsi, _ := strconv.ParseUint(bs, 10, 64)
	return asi > bsi
}

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

// gap reports whether e, pushed, skips a batch of the generation followed: read the stream.
func (p *position) gap(e entry) bool {
	return e.kind != entryGen && e.token == p.token && !p.lost && e.n != p.n
}

// apply feeds one entry to f; ok when the attempt ended.
func (p *position) apply(f *flight, e entry) (followEnd, bool) {
	p.last = e.id
	if e.token != p.token {
		if e.kind == entryGen { // a takeover: a new generation starts here
			f.startGen(RoleFollower, false)
			p.token, p.n, p.attempt, p.lost = e.token, 1, e.attempt, false
		}
		return followEnd{}, false
	}
	if e.kind == entryGen {
		return followEnd{}, false
	}
	if e.n != p.n && !p.lost {
		// Entries are missing: wait for the end (ADRs 0005, 0006).
		p.lost = true
	}
	p.n = e.n + 1
	if p.lost {
		switch e.kind {
		case entryDone:
			return followEnd{kind: followLost}, true
		case entryFailed:
			return followEnd{kind: followFailed, shutdown: e.shutdown}, true
		}
		return followEnd{}, false
	}
	head := e.head()
	switch e.kind {
	case entryChunk:
		if head != nil {
			f.setHead(*head)
		}
		f.appendChunk([]byte(e.data))
	case entryDone:
		if head == nil {
			head = &Head{Status: 200}
		}
		f.setLanded(e.landed)
		f.finish(*head, []byte(e.data))
		return followEnd{kind: followDone}, true
	case entryFailed:
		res := Result{Outcome: Retry, Body: []byte(e.data)}
		if head != nil {
			res.Head = *head
		}
		f.resetGen(nil)
		return followEnd{kind: followFailed, res: res, shutdown: e.shutdown}, true
	}
	return followEnd{}, false
}
