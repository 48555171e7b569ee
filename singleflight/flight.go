package singleflight

import (
	"bytes"
	"context"
	"io"
	"sync"
	"time"
)

// flight is one key's local flight: a broadcast log, one generation per attempt, that
// every local reader reads from its own position. Only the flight's leader writes to it.
type flight struct {
	key     string
	lkey    string // its key in Group.flights
	noCache bool
	fn      Func
	call    CallOptions // what the caller that started it asked for
	started time.Time

	cancel context.CancelCauseFunc // ends the flight's lead

	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every change
	readers     int           // readers not yet closed
	starterOpen bool          // the starter's Reader (the caller whose fn this is) has not closed
	// unserved counts the open readers that have delivered nothing: only they can use a
	// new generation (ADR 0026).
	unserved      int
	starterServed bool
	owning        bool // this process runs the current attempt
	gen           int
	role          Role // of the current generation
	age           time.Duration
	head          *Head
	chunks        [][]byte
	ended         bool
	endErr        error // with ended: the flight ended with this error instead of a response
	// starterFail is the failed response of the starter's own function, which the
	// starter's reader gets as is (ADR 0025).
	starterFail *Result
	attempts    int // owned attempts run here, for the flights listing
	// The landing gate (answered.go): Redis's clock as the lookups read it, and the landing.
	clockFirst, clockLast clockRef
	landed                int64
	landedAt              time.Time // owned here: when the final write was sent
	// Abandonment (abandon.go, ADR 0074): whether anyone still waits for the call.
	seq         uint64        // this flight among the Group's, in its mark in Redis
	starterGone bool          // the starter's caller ended before it could close its Reader
	finishAll   bool          // a caller asked that the call finish even if nobody waits
	owned       *ownedAttempt // the attempt owned here, while it runs, which a cut would end
	idle        idleSpell     // no caller waits here for the attempt owned here
	idleTimer   *time.Timer   // cuts the attempt once the spell has lasted the grace
}

func newFlight(key, lkey string, noCache bool, fn Func, cancel context.CancelCauseFunc) *flight {
	return &flight{key: key, lkey: lkey, noCache: noCache, fn: fn, cancel: cancel, changed: make(chan struct{})}
}

// broadcast wakes every reader; f.mu must be held.
func (f *flight) broadcast() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *flight) startGen(role Role, owning bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.role, f.owning = role, owning
	f.attempts += btoi(owning)
	f.head, f.chunks = nil, nil
	f.broadcast()
}

// decide records the leader's role before its generation starts: a caller joining from
// then on knows the flight serves no stored answer (see joinable).
func (f *flight) decide(role Role) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.role == RoleUnknown {
		f.role = role
	}
}

// resetGen abandons the current generation; a first starterFail is kept.
func (f *flight) resetGen(starterFail *Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.owning = false
	f.head, f.chunks = nil, nil
	if starterFail != nil && f.starterFail == nil {
		f.starterFail = starterFail
	}
	f.broadcast()
}

func (f *flight) setHead(h Head) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.head == nil {
		f.head = &h
		f.broadcast()
	}
}

func (f *flight) appendChunk(p []byte) {
	if len(p) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.chunks = append(f.chunks, p)
	f.noteUnread(len(p))
	f.broadcast()
}

func (f *flight) finish(h Head, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return
	}
	if f.head == nil {
		f.head = &h
	}
	if len(body) > 0 {
		f.chunks = append(f.chunks, body)
	}
	f.ended = true
	f.broadcast()
}

// finishWith ends the flight with a response in a generation of its own.
func (f *flight) finishWith(h Head, body []byte) {
	f.resetGen(nil)
	f.finish(h, body)
}

// continueWith ends the current generation with body, of which the log holds a prefix;
// false, and nothing changed, when it does not (ADR 0006).
func (f *flight) continueWith(h Head, body []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return true
	}
	off := 0
	for _, c := range f.chunks {
		if off+len(c) > len(body) || !bytes.Equal(body[off:off+len(c)], c) {
			return false
		}
		off += len(c)
	}
	if f.head == nil {
		f.head = &h
	}
	if off < len(body) {
		f.chunks = append(f.chunks, body[off:])
	}
	f.ended = true
	f.broadcast()
	return true
}

func (f *flight) finishHit(h Head, body []byte, age time.Duration) {
	f.mu.Lock()
	f.role, f.age = RoleHit, age
	f.mu.Unlock()
	f.finishWith(h, body)
}

func (f *flight) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return
	}
	f.ended, f.endErr = true, err
	f.broadcast()
}

func (f *flight) hasEnded() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ended
}

// canUseNewGen reports whether a reader is left that has delivered nothing and does not
// hold the starter's own failed answer.
func (f *flight) canUseNewGen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.unserved
	if f.starterFail != nil && f.starterOpen && !f.starterServed {
		n--
	}
	return n > 0
}

// begun reports whether a generation was started: before, callers may not be counted yet.
func (f *flight) begun() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen > 0
}

// othersWaiting reports whether readers other than the starter's could use a new attempt.
func (f *flight) othersWaiting() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.unserved
	if f.starterOpen && !f.starterServed {
		n--
	}
	return n > 0
}

// served records that a reader delivered its first bytes, or its end; f.mu held.
func (f *flight) served(starter bool) {
	f.unserved--
	if starter {
		f.starterServed = true
	}
}

// Reader reads one caller's outcome of a flight. It is not safe for concurrent use.
type Reader struct {
	g       *Group
	f       *flight
	starter bool // this Reader is the starter's, the caller whose call started the flight
	// What the caller asked for, and when it joined: for rejoin.
	fn     Func
	call   CallOptions
	joined time.Time

	gen       int
	idx       int
	delivered bool
	head      Head
	role      Role
	age       time.Duration
	private   [][]byte // the starter's own failed response, when it gets one
	privEnd   bool
	closed    bool
}

// Next returns the next chunk of the outcome, blocking until one is there, then io.EOF;
// Head is valid from then. A reader with bytes of an abandoned generation gets
// ErrGenerationChanged; a flight that failed for good, an error wrapping ErrFailed.
func (r *Reader) Next(ctx context.Context) ([]byte, error) {
	if r.closed {
		return nil, ErrClosed
	}
	if r.privEnd {
		return r.nextPrivate()
	}
	f := r.f
	for {
		f.mu.Lock()
		if r.starter && !r.delivered && f.starterFail != nil {
			lf := f.starterFail
			f.served(true)
			f.mu.Unlock()
			r.privEnd, r.head, r.role, r.delivered = true, lf.Head, RoleOwner, true
			if len(lf.Body) > 0 {
				r.private = [][]byte{lf.Body}
			}
			return r.nextPrivate()
		}
		if r.gen != f.gen {
			if r.delivered {
				f.mu.Unlock()
				return nil, ErrGenerationChanged
			}
			r.gen, r.idx = f.gen, 0
		}
		if f.ended && !r.delivered && f.joinedAfterAnswer(r.joined) {
			f.mu.Unlock()
			if err := r.rejoin(); err != nil {
				return nil, err
			}
			f = r.f
			continue
		}
		if r.idx < len(f.chunks) && f.head != nil {
			c := f.chunks[r.idx]
			r.idx++
			r.deliver(f)
			f.mu.Unlock()
			return c, nil
		}
		if f.ended {
			if f.endErr != nil {
				err := f.endErr
				f.mu.Unlock()
				return nil, err
			}
			r.deliver(f)
			f.mu.Unlock()
			return nil, io.EOF
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// rejoin leaves f for a new join of its key: the answer may have landed first (ADR 0021).
func (r *Reader) rejoin() error {
	old, starter := r.f, r.starter
	call := r.call
	call.Inline = false // the caller is reading: it cannot lead
	nr, err := r.g.DoWith(old.key, call, r.fn)
	r.g.leave(old, starter, false)
	if err != nil {
		r.closed = true
		return err
	}
	*r = *nr
	return nil
}

// deliver records what the caller is being given; f.mu must be held.
func (r *Reader) deliver(f *flight) {
	if !r.delivered {
		r.delivered = true
		f.served(r.starter)
		r.head = *f.head
		r.age = f.age
		r.role = f.role
		if f.role == RoleOwner && !r.starter {
			r.role = RoleFollower
		}
	}
}

func (r *Reader) nextPrivate() ([]byte, error) {
	r.delivered = true
	if r.head.Status == 0 {
		return nil, ErrFailed
	}
	if len(r.private) == 0 {
		return nil, io.EOF
	}
	c := r.private[0]
	r.private = r.private[1:]
	return c, nil
}

// Head returns the status and headers of the outcome being read.
func (r *Reader) Head() Head { return r.head }

// Role says how this caller was served, or was to be: RoleUnknown if not decided yet.
func (r *Reader) Role() Role {
	if r.delivered || r.closed {
		return r.role
	}
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.role == RoleOwner && !r.starter {
		return RoleFollower
	}
	return r.f.role
}

// Age is how old a stored result was when it was served (role hit).
func (r *Reader) Age() time.Duration { return r.age }

// Close releases the reader. A flight whose last reader leaves stops unless owned here.
func (r *Reader) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.g.leave(r.f, r.starter, r.delivered)
}
