package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// The upstream's stand-in: it numbers its calls, and answers each as its plan says. Call n
// of a key writes the chunks "key.n.0;", "key.n.1;", ... so that a client's bytes name the
// one call they came from.

// plan is how the upstream answers one call.
type plan struct {
	chunks int
	gap    time.Duration // before each chunk
	// fail: "" answers whole; "500" at once (retried); "400" at once (shared, not stored);
	// "error" (the connection fails at once); "midway" (it fails after half the chunks);
	// "hang" (nothing comes until the call is cancelled).
	fail string
}

func (p plan) String() string {
	s := fmt.Sprintf("%d chunks %s apart", p.chunks, p.gap)
	if p.fail != "" {
		s += ", then " + p.fail
	}
	return s
}

// call is one upstream call, as the upstream saw it.
type call struct {
	n       int
	key     string
	inst    string
	attempt int
	plan    plan
	start   time.Duration
	by      *client // whose function it runs: the starter of the flight

	// Set when it ended, under upstream.mu.
	ended   bool
	end     time.Duration
	how     string // ok, failed (an answer that is no success), error, cancelled
	cause   error  // of a cancelled call: its context's cause
	sent    int    // chunks written
	outcome singleflight.Outcome
}

func (c *call) chunk(i int) string { return fmt.Sprintf("%s.%d.%d;", c.key, c.n, i) }

// body is the whole answer of a call that ends well.
func (c *call) body() string {
	var b strings.Builder
	for i := range c.plan.chunks {
		b.WriteString(c.chunk(i))
	}
	return b.String()
}

type upstream struct {
	w *world

	mu    sync.Mutex
	calls []*call
	plans func(key string, n int) plan // the plan of the nth call of a key
}

// fn is the owner function of client c's requests.
func (u *upstream) fn(c *client) singleflight.Func {
	return func(ctx context.Context, wr *singleflight.Writer) (singleflight.Result, error) {
		cl := u.begin(c, singleflight.AttemptOf(ctx).N)
		res, err := u.answer(ctx, c, cl, wr)
		u.finish(cl, ctx, res, err)
		return res, err
	}
}

func (u *upstream) begin(c *client, attempt int) *call {
	u.mu.Lock()
	n := len(u.calls) + 1
	perKey := 1
	for _, o := range u.calls {
		if o.key == c.key {
			perKey++
		}
	}
	cl := &call{n: n, key: c.key, inst: c.inst.id, attempt: attempt, plan: u.plans(c.key, perKey),
		start: u.w.now(), by: c}
	u.calls = append(u.calls, cl)
	u.mu.Unlock()
	u.w.hist.add(c.inst.id, kCall, caller(), "%s: call %d starts (attempt %d): %s", c.key, n, attempt, cl.plan)
	return cl
}

var errUpstream = errors.New("upstream: connection failed")

func (u *upstream) answer(ctx context.Context, c *client, cl *call, wr *singleflight.Writer) (singleflight.Result, error) {
	stream := u.w.keys[c.key].stream
	failed := func(status int, what string) singleflight.Result {
		h := singleflight.Head{Status: status}
		return singleflight.Result{Head: h, Body: []byte(fmt.Sprintf("%s.%d.%s;", c.key, cl.n, what)), Outcome: singleflight.Retry}
	}
	switch cl.plan.fail {
	case "500":
		return failed(500, "fail"), nil
	case "400":
		r := failed(400, "refused")
		r.Outcome = singleflight.Share
		return r, nil
	case "error":
		return failed(502, "error"), errUpstream
	}
	if stream {
		wr.WriteHead(singleflight.Head{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}})
	}
	var body []byte
	for i := range cl.plan.chunks {
		if cl.plan.fail == "midway" && i == cl.plan.chunks/2 {
			return failed(502, "error"), errUpstream
		}
		if err := c.inst.sleep(ctx, cl.plan.gap); err != nil {
			return failed(502, "error"), err
		}
		if cl.plan.fail == "hang" {
			<-ctx.Done()
			return failed(504, "timeout"), context.Cause(ctx)
		}
		p := []byte(cl.chunk(i))
		if stream {
			if _, err := wr.Write(p); err != nil {
				return failed(502, "error"), err
			}
		} else {
			body = append(body, p...)
		}
		u.mu.Lock()
		cl.sent++
		u.mu.Unlock()
	}
	o := singleflight.Store
	if c.noStore {
		o = singleflight.Share
	}
	if stream {
		return singleflight.Result{Outcome: o}, nil
	}
	return singleflight.Result{Head: singleflight.Head{Status: 200}, Body: body, Outcome: o}, nil
}

func (u *upstream) finish(cl *call, ctx context.Context, res singleflight.Result, err error) {
	u.mu.Lock()
	cl.ended, cl.end, cl.outcome = true, u.w.now(), res.Outcome
	switch {
	case ctx.Err() != nil:
		cl.how, cl.cause = "cancelled", context.Cause(ctx)
	case err != nil:
		cl.how = "error"
	case res.Outcome == singleflight.Retry || res.Head.Status >= 400:
		cl.how = "failed"
	default:
		cl.how = "ok"
	}
	how := cl.how
	if cl.cause != nil {
		how += " (" + causeWord(cl.cause) + ")"
	}
	u.mu.Unlock()
	u.w.hist.add(cl.inst, kCall, caller(), "%s: call %d ends: %s after %d chunks", cl.key, cl.n, how, cl.sent)
}

// causeWord names why a call's context ended.
func causeWord(err error) string {
	for _, e := range []error{singleflight.ErrAbandoned, singleflight.ErrLeaseLost, singleflight.ErrTimeout,
		singleflight.ErrShutdown, errKilled} {
		if errors.Is(err, e) {
			return strings.TrimPrefix(e.Error(), "singleflight: ")
		}
	}
	return err.Error()
}

// startOf is when call n started.
func (u *upstream) startOf(n int) time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[n-1].start
}

// snapshot returns a copy of the calls, each as it is now.
func (u *upstream) snapshot() []call {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]call, len(u.calls))
	for i, c := range u.calls {
		out[i] = *c
	}
	return out
}

// seededPlans draws each call's plan from the seed, the key and the call's number alone, so
// that a run's plans do not depend on the order its goroutines ran in.
func seededPlans(seed int64, draw func(r *rnd) plan) func(string, int) plan {
	return func(key string, n int) plan {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s/%d", seed, key, n)
		return draw(newRnd(int64(h.Sum64())))
	}
}
