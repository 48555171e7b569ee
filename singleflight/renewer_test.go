package singleflight

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// finalWriteHook holds every final write (complete) until release is closed, saying whose
// it holds, then sends it whatever its deadline; and reports each renewal pipeline: the
// round under way, whether it is a round's start (it carries the alive message) or a
// renewal made later, and the flights it renewed. Before a pipeline renews meta, it reads
// Redis's lease and clock, and counts a lease that ran out; with failNext set, the next
// later renewal of meta fails without reaching Redis.
type finalWriteHook struct {
	rn       func() *renewer
	meta     string
	check    redis.UniversalClient
	held     chan string // the meta key of each final write held
	release  chan struct{}
	rounds   chan roundSeen
	failNext atomic.Bool
	lapsed   atomic.Int32
}

type roundSeen struct {
	n       int64 // the round under way
	start   bool
	renewed []string // meta keys
	failed  bool     // made to fail (failNext)
}

func (h *finalWriteHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *finalWriteHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 3 && a[0] == "evalsha" && a[1] == completeScript.Hash() {
			h.held <- a[3].(string)
			<-h.release
			return next(context.WithoutCancel(ctx), cmd)
		}
		return next(ctx, cmd)
	}
}
func (h *finalWriteHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		seen := roundSeen{}
		seen.start, seen.renewed, _ = renewalsIn(cmds)
		if !seen.start && len(seen.renewed) == 0 {
			return next(ctx, cmds)
		}
		seen.n = h.rn().round.Load() // the renewer's pipeline: it exists
		if slices.Contains(seen.renewed, h.meta) {
			until, err := h.check.HGet(ctx, h.meta, "lease_until").Int64()
			now, terr := h.check.Time(ctx).Result()
			if err == nil && terr == nil && until <= now.UnixMilli() {
				h.lapsed.Add(1)
			}
			if !seen.start && h.failNext.CompareAndSwap(true, false) {
				seen.failed = true
				h.rounds <- seen
				return failAll(cmds, errors.New("injected: the renewal did not reach Redis"))
			}
		}
		select {
		case h.rounds <- seen:
		default:
		}
		return next(ctx, cmds)
	}
}

// While an owner's final write is being made (here held for longer than a lease), its lease
// is not renewed at a round's start but later, when an interval of it is left, and never runs
// out: a later renewal that fails is tried again before the lease would. So a new caller that
// comes after the lease would have run out follows the flight instead of taking it over, and
// the upstream is called once.
func TestRenewalWhileFinalWriteIsMade(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name            string
		interval, lease time.Duration
		failOne         bool
	}{
		{"lease of ten intervals", 50 * time.Millisecond, 500 * time.Millisecond, false},
		{"lease of three intervals", 100 * time.Millisecond, 300 * time.Millisecond, false},
		{"lease of three intervals, a later renewal failing", 100 * time.Millisecond, 300 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uniqueKey()
			meta := "ai:flight:meta:{" + key + "}"
			var a *Group
			hook := &finalWriteHook{rn: func() *renewer { return a.rem().renewer }, meta: meta, check: srv.Client(),
				held: make(chan string, 1), release: make(chan struct{}), rounds: make(chan roundSeen, 1000)}
			client := srv.Client()
			client.AddHook(hook)
			o := Options{HeartbeatInterval: tc.interval, LeaseTTL: tc.lease}
			oa := o
			oa.Redis = client
			a = New(oa)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				a.Close(ctx)
			})
			rec := newRecorder()
			oc := o
			oc.Observer = rec
			c := backend{redis: srv}.group(t, oc)
			rp := newReply("answer")
			answer := sync.OnceFunc(rp.release)
			unblock := sync.OnceFunc(func() { close(hook.release) })
			t.Cleanup(func() { unblock(); answer() }) // before a and c are closed, whatever failed

			ra, err := a.Do(key, false, rp.fn)
			if err != nil {
				t.Fatal(err)
			}
			waitCond(t, 10*time.Second, "a owns the flight", func() bool { return a.Owned() == 1 })
			answer()
			select {
			case <-hook.held:
			case <-time.After(10 * time.Second):
				t.Fatal("the final write was never made")
			}
			heldIn := a.rem().renewer.round.Load() // a round begun before may still renew it

			// Six later renewals since the write was held: more than a lease.
			later, started, failed := 0, 0, false
			deadline := time.After(10 * time.Second)
			for later < 6 {
				select {
				case r := <-hook.rounds:
					switch {
					case r.n <= heldIn:
					case r.start && slices.Contains(r.renewed, meta):
						t.Fatalf("a round renewed at its start a lease whose final write is being made (%d rounds after the write, a renewal made to fail: %v)", started, failed)
					case r.start:
						started++
					case r.failed:
						failed = true
					case slices.Contains(r.renewed, meta):
						later++
						if later == 2 && tc.failOne {
							hook.failNext.Store(true)
						}
					}
				case <-deadline:
					t.Fatalf("later renewals of the lease after the final write was held: %d of 6 (%d rounds)", later, started)
				}
			}
			if tc.failOne && !failed {
				t.Fatal("no renewal was made to fail")
			}
			rc, err := c.Do(key, false, rp.fn)
			if err != nil {
				t.Fatal(err)
			}
			rec.waitFor(t, EventRole, 1, 10*time.Second)
			unblock()

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if out := readAll(ctx, ra); out.err != nil || out.body != "answer" {
				t.Fatalf("owner's reader: %+v", out)
			}
			if out := readAll(ctx, rc); out.err != nil || out.body != "answer" || out.role != RoleFollower {
				t.Fatalf("a caller that came after a lease: %+v; want the answer, as a follower", out)
			}
			if n := hook.lapsed.Load(); n != 0 {
				t.Errorf("the lease had run out before %d of its renewals", n)
			}
			if n := rp.calls.Load(); n != 1 {
				t.Errorf("owner function ran %d times, want 1", n)
			}
			if n := rec.count(EventTakeover); n != 0 {
				t.Errorf("%d takeovers while the final write was being made", n)
			}
		})
	}
}

// renewFailHook fails the first pipeline of renewals after armed is set, as a Redis that
// does not answer would, and reports the round of every pipeline of renewals sent.
type renewFailHook struct {
	armed atomic.Bool
	rn    func() *renewer
	sent  chan renewSent
}

// renewSent is a pipeline of renewals sent: the round counter then, and whether it failed.
type renewSent struct {
	round  int64
	failed bool
}

func (h *renewFailHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *renewFailHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *renewFailHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if _, renews, _ := renewalsIn(cmds); len(renews) == 0 {
			return next(ctx, cmds)
		}
		fail := h.armed.CompareAndSwap(true, false)
		select {
		case h.sent <- renewSent{h.rn().round.Load(), fail}:
		default:
		}
		if fail {
			return failAll(cmds, errors.New("connection refused (injected)"))
		}
		return next(ctx, cmds)
	}
}

// A round whose renewals fail (Redis did not answer) is followed by another try a quarter
// interval on, not by the next round only: after an outage the owner's first renewal to
// reach Redis comes within a quarter interval of it, before its lease may run out.
func TestFailedRenewalTriedBeforeNextRound(t *testing.T) {
	srv := redistest.Start(t)
	hook := &renewFailHook{sent: make(chan renewSent, 16)}
	c := srv.Client()
	c.AddHook(hook)
	g := New(Options{Redis: c, HeartbeatInterval: 400 * time.Millisecond, LeaseTTL: 2 * time.Second})
	t.Cleanup(func() { g.Close(context.Background()) })
	hook.rn = func() *renewer { return g.rem().renewer }
	gate := make(chan struct{})
	defer close(gate)
	r, err := g.Do(uniqueKey(), false, func(ctx context.Context, w *Writer) (Result, error) {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return Result{Head: Head{Status: 200}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sent := func() renewSent {
		t.Helper()
		select {
		case s := <-hook.sent:
			return s
		case <-time.After(5 * time.Second):
			t.Fatal("no renewal sent within 5s")
			return renewSent{}
		}
	}
	sent() // a first round renews
	hook.armed.Store(true)
	failed := sent()
	for !failed.failed {
		failed = sent()
	}
	if next := sent(); next.round != failed.round {
		t.Fatalf("after the renewals of round %d failed, the next renewal was sent in round %d; want a retry within round %d", failed.round, next.round, failed.round)
	}
}

// The heartbeat ends with the hard timeout, even for an owner function that ignores its
// context: the lease then runs out and a follower takes over.
func TestHeartbeatStopsAtHardTimeout(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{Timeout: 300 * time.Millisecond, LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, MaxAttempts: 2}
	a, f := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	stuckOwner(t, a, key)
	rp := newReply("second")
	rp.release()
	if got := doAll(t, f, key, 1, rp.fn)()[0]; got.body != "second" {
		t.Fatalf("follower got (%q, %v); want the takeover's answer", got.body, got.err)
	}
}

// scriptTextHook reports each pipeline of renewals: whether it starts a round (it carries
// the alive message) and how many of its renewals carry the script's text (EVAL) or its
// SHA (EVALSHA).
type scriptTextHook struct{ sent chan renewPipeline }

type renewPipeline struct {
	start       bool
	texts, shas int
}

func (h *scriptTextHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *scriptTextHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *scriptTextHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start, bySHA, texts := renewalsIn(cmds)
		p := renewPipeline{start: start, shas: len(bySHA), texts: texts}
		if p.texts+p.shas > 0 {
			select {
			case h.sent <- p:
			default:
			}
		}
		return next(ctx, cmds)
	}
}

// A Redis that lost its scripts (a restart, a failover, SCRIPT FLUSH) is sent the renewal
// script's text once, not once per lease renewed: over a slow link, a round's renewals
// carrying it each (6.6 KB) took longer than a lease (docs/redis-faults.md).
func TestRenewalsSendALostScriptOnce(t *testing.T) {
	srv := redistest.Start(t)
	hook := &scriptTextHook{sent: make(chan renewPipeline, 64)}
	c := srv.Client()
	c.AddHook(hook)
	g := New(Options{Redis: c, HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: 2 * time.Second})
	t.Cleanup(func() { g.Close(context.Background()) })
	const owned = 4
	gate := make(chan struct{})
	defer close(gate)
	for range owned {
		r, err := g.Do(uniqueKey(), false, func(ctx context.Context, w *Writer) (Result, error) {
			select {
			case <-gate:
			case <-ctx.Done():
			}
			return Result{Head: Head{Status: 200}}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
	}
	waitCond(t, 10*time.Second, "the flights owned", func() bool { return g.Owned() == owned })
	next := func() renewPipeline {
		t.Helper()
		select {
		case p := <-hook.sent:
			return p
		case <-time.After(5 * time.Second):
			t.Fatal("no renewal sent within 5s")
			return renewPipeline{}
		}
	}
	for p := next(); !p.start || p.shas != owned; p = next() { // a round renews all four
	}
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for len(hook.sent) > 0 { // sent before the flush
		<-hook.sent
	}
	p := next()
	for p.texts == 0 {
		p = next()
	}
	texts := p.texts
	for p = next(); !p.start; p = next() { // until the next round's start
		texts += p.texts
	}
	if texts != 1 {
		t.Fatalf("the renewal script's text sent %d times after Redis lost it, renewing %d leases; want once", texts, owned)
	}
	if p.texts != 0 || p.shas != owned {
		t.Fatalf("the round after: %d renewals by text, %d by SHA; want %d by SHA", p.texts, p.shas, owned)
	}
}
