package singleflight

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/poll"
	"github.com/redis/go-redis/v9"
)

// errStreamFull: the stream holds StreamMaxLen entries; the final write carries the rest.
var errStreamFull = errors.New("singleflight: stream full")

// remoteOwnership is one owned attempt in Redis: every write is fenced by token, and
// carries what restore.lua needs (ADR 0010).
//
// Who touches what: the fields up to attempt are fixed when it is made; the atomics are
// shared with the renewer and cutDue; the final write's fields are written by own's
// goroutine (final, try) until goOn starts, then by goOn's alone (again, try).
type remoteOwnership struct {
	r       *remote
	f       *flight
	key     string
	k       flightKeys
	token   string
	attempt int
	until   atomic.Int64 // lease_until, Redis time in ms; 0: unknown
	n       atomic.Int64 // batches appended
	// leaseFrom: when the command that last gave the lease, LeaseTTL long, was sent (mono).
	leaseFrom atomic.Int64
	// finalPending: the final write is being made (ADR 0008).
	finalPending atomic.Bool
	// cutIn: Redis cut the flight (ADR 0074): nothing is renewed or written any more; a
	// caller that came meanwhile is served by the call alone.
	cutIn atomic.Bool
	// The final write, made again while retryUntil says (again): its op and write, the
	// lease's end as it stood after the first try, and how it last ended (raw: Redis's
	// error; ferr: as the owner sees it).
	op        string
	write     func(context.Context) (int64, error)
	wctx      context.Context
	leaseEnd  time.Time
	raw, ferr error
}

var monoStart = time.Now()

// mono is t on this process's monotonic clock, in ns, for lease arithmetic.
func mono(t time.Time) int64 { return int64(t.Sub(monoStart)) }

func newRemoteOwnership(r *remote, f *flight, d decision) *remoteOwnership {
	o := &remoteOwnership{r: r, f: f, key: f.key, k: r.keys(f.key), token: d.token, attempt: d.attempt}
	o.until.Store(d.until)
	if !d.clock.sent.IsZero() {
		o.leaseFrom.Store(mono(d.clock.sent))
	}
	return o
}

// restoreArgs are the last six arguments of every owner's write (see restore.lua).
func (o *remoteOwnership) restoreArgs() []any {
	until := ""
	if u := o.until.Load(); u > 0 {
		until = strconv.FormatInt(u, 10)
	}
	return []any{o.r.g.opts.InstanceID, o.attempt, until, o.n.Load(), o.r.g.opts.LeaseTTL.Milliseconds(), o.r.runningTTL()}
}

func (o *remoteOwnership) args(a ...any) []any { return append(a, o.restoreArgs()...) }

func (o *remoteOwnership) shared() bool { return !o.cutIn.Load() }

func (o *remoteOwnership) unusable() bool { return o.r.unusable(o.key) }

func (o *remoteOwnership) unwritten() { o.r.renewer.unwritten(o.token) }

// fenced turns a script's 0 into ErrLeaseLost, and -1 into ErrFlightGone.
func (o *remoteOwnership) fenced(op string, v int64, err error) error {
	if err != nil {
		return o.r.redisErr(op, o.key, err)
	}
	switch v {
	case 0:
		return ErrLeaseLost
	case -1:
		return ErrFlightGone
	}
	return nil
}

func (o *remoteOwnership) heartbeat(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	return o.r.renewer.add(ctx, o, cancel)
}

func (o *remoteOwnership) renewArgs() []any {
	idle, callers := o.cutArgs()
	return o.args(o.token, o.r.g.opts.LeaseTTL.Milliseconds(), o.r.runningTTL(), idle, o.r.g.opts.AbandonGrace.Milliseconds(), callers)
}

// cutArgs are what renew.lua needs to cut a call nobody waits for (ADR 0074): how long
// nobody has waited here (empty while one does, or one asked to finish), and the callers
// waiting here.
func (o *remoteOwnership) cutArgs() (idle string, callers int) {
	f := o.f
	f.mu.Lock()
	callers = f.waiting()
	may, since := f.mayCut(), f.idle.since
	f.mu.Unlock()
	if !may {
		return "", callers
	}
	return strconv.FormatInt(time.Since(since).Milliseconds(), 10), callers
}

// cutRenew is renew.lua's answer that it cut the flight.
const cutRenew = -2

// cut asks Redis to cut the flight now, with a renewal that says how long nobody has
// waited here; false (the lease renewed, or Redis not asked) leaves the call running. A
// flight Redis lost past its lease has no follower anywhere (their looks find it gone): it
// is cut here alone.
func (o *remoteOwnership) cut(ctx context.Context) bool {
	if o.cutIn.Load() {
		return true // Redis cut it already; a caller that came meanwhile has left too
	}
	if o.r.unusable(o.key) {
		return false // followers elsewhere cannot be seen: the call goes on
	}
	ctx, cancel := o.r.watchedOp(ctx, o.k.meta)
	defer cancel()
	sent := mono(time.Now())
	v, err := o.renewRun(ctx).Int64()
	if err == nil && (v == cutRenew || v == -1) {
		o.cutIn.Store(true) // cutDue carries the cut out
		return true
	}
	_ = o.renewed(sent, v, err)
	return false
}

// cutLearned acts on Redis's word that the flight is cut, whichever reply brought it (a
// renewal's, an append's), when cut did not: the first to learn it carries the cut out,
// even if the reply of the renewal that cut was lost (ADR 0074).
func (o *remoteOwnership) cutLearned() {
	if !o.cutIn.Swap(true) {
		o.r.g.cutAttempt(o.f, o)
	}
}

// idleFor is how long nobody has waited here for the attempt, if nobody does and none
// asked that it finish.
func (o *remoteOwnership) idleFor() (time.Duration, bool) {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.mayCut() {
		return 0, false
	}
	return time.Since(f.idle.since), true
}

// renewCall is a renewal of the lease, to send in a pipeline.
func (o *remoteOwnership) renewCall() *scriptCall {
	return &scriptCall{script: renewScript, keys: []string{o.k.meta, o.k.stream}, args: o.renewArgs()}
}

// renewRun renews alone, sending the script where Redis lost it.
func (o *remoteOwnership) renewRun(ctx context.Context) *redis.Cmd {
	return renewScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream}, o.renewArgs()...)
}

// renewed takes the answer of a renewal sent at sent (mono).
func (o *remoteOwnership) renewed(sent int64, v int64, err error) error {
	if err == nil && v > 0 {
		o.until.Store(v)
		o.leaseFrom.Store(sent)
	}
	return o.fenced("renew", v, err)
}

func (o *remoteOwnership) appendBatch(ctx context.Context, n int, head *Head, data []byte) error {
	if o.cutIn.Load() {
		return nil
	}
	// Not sent to a shard found down: it would hold the Writer, and at the call's end the
	// owner's callers, for a Redis timeout. The batch is kept: the next flush or the final
	// write carries it. A suspected shard's verdict is waited for (ADRs 0062, 0081).
	if o.r.awaitVerdict(ctx, o.key); o.r.degradedFor(o.key) {
		return errShardDown
	}
	ctx, cancel := o.r.watchedOp(ctx, o.k.meta)
	defer cancel()
	status, header := "", ""
	if head != nil {
		status, header = strconv.Itoa(head.Status), encodeHead(*head)
	}
	v, err := appendScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream},
		o.args(o.token, n, status, header, data, o.r.runningTTL(), o.r.g.opts.StreamMaxLen)...).Int64()
	if err == nil && v == 2 {
		return errStreamFull
	}
	if err == nil && v == cutRenew {
		o.cutLearned() // cut meanwhile, its renewal's reply perhaps lost (ADR 0074)
		return nil
	}
	if err == nil && v == 1 {
		o.n.Store(int64(n))
	}
	return o.fenced("append", v, err)
}

// largeWrite is the size from which a final write goes alone, not in a shared pipeline,
// with a deadline grown by a second per writeRate bytes (ADR 0056).
const (
	largeWrite = 1 << 20
	writeRate  = 8 << 20
)

func (o *remoteOwnership) complete(ctx context.Context, fin final) error {
	opts := o.r.g.opts
	keys := []string{o.k.meta, o.k.stream, o.k.result}
	args := o.args(o.token, fin.landedN, fin.skip, fin.head.Status, encodeHead(fin.head), fin.tail, fin.transcript,
		flag(fin.store), fin.ttl.Milliseconds(), opts.Linger.Milliseconds())
	size := len(fin.tail) + len(fin.transcript)
	if size < largeWrite {
		return o.final(ctx, "complete", func(context.Context) (int64, error) { // the batch has its deadline
			return o.r.coalesce.run(completeScript, keys, args...).Int64()
		})
	}
	return o.final(ctx, "complete", func(ctx context.Context) (int64, error) {
		ctx, cancel := o.r.watchedUntil(ctx, o.k.meta, time.Now().Add(opts.RedisTimeout+time.Duration(size)*time.Second/writeRate))
		defer cancel()
		return completeScript.Run(ctx, o.r.rdb, keys, args...).Int64()
	})
}

func (o *remoteOwnership) fail(ctx context.Context, res Result, reason string) error {
	if o.cutIn.Load() {
		return nil // the cut ended the attempt in Redis (ADR 0074)
	}
	status, header := "", encodeHead(res.Head) // once: the write may be made again
	if res.Head.Status != 0 {
		status = strconv.Itoa(res.Head.Status)
	}
	return o.final(ctx, "fail", func(ctx context.Context) (int64, error) {
		ctx, cancel := o.r.watchedOp(ctx, o.k.meta)
		defer cancel()
		return failScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream},
			o.args(o.token, status, header, res.Body, reason, o.r.runningTTL())...).Int64()
	})
}

// final makes a final write once (none while the flight's shard is degraded), and keeps
// it to be made again (see again). A whole answer is written even to a flight this owner
// cut: nobody claimed it since, and the answer is kept (complete.lua, ADR 0074).
func (o *remoteOwnership) final(ctx context.Context, op string, write func(context.Context) (int64, error)) error {
	o.finalPending.Store(true)
	o.op, o.write, o.wctx = op, write, ctx
	err := o.try()
	// The heartbeat renews the lease while the write is made again, so that no other
	// owner takes the flight; it does not extend the retries (ADRs 0056, 0060).
	o.leaseEnd = time.Now().Add(o.leaseLeft())
	return err
}

func (o *remoteOwnership) try() error {
	switch {
	case o.r.degradedFor(o.key):
		o.raw, o.ferr = errShardDown, errShardDown
		return o.ferr
	case o.r.suspected(o.key): // not sent; again waits for the verdict (ADR 0056)
		o.raw, o.ferr = errSlow, errSlow
		return o.ferr
	}
	v, err := o.write(o.wctx)
	o.raw, o.ferr = err, o.fenced(o.op, v, err)
	return o.ferr
}

// leaseLeft is how long the lease Redis last gave this attempt runs on.
func (o *remoteOwnership) leaseLeft() time.Duration {
	from := o.leaseFrom.Load()
	if from == 0 {
		return 0
	}
	return time.Duration(from + int64(o.r.g.opts.LeaseTTL) - mono(time.Now()))
}

// retryUntil is until when the final write is made again, or zero: not again. Zero when
// Redis answered it (raw nil, or a refusal), no lease was ever given, or the Group closes.
// Otherwise the lease as it stood after the first try (ADR 0024), or, while the flight's
// shard is degraded (or was, at the last try) or suspected, a Linger past it, while Redis
// may still hold the running meta (runningTTL). A suspicion counts as the verdict it may
// become: no write is dropped for a PING not answered yet; again waits for it. Past the
// lease another owner may have claimed the flight: the token decides, and restore.lua puts
// nothing back (ADRs 0056, 0060).
func (o *remoteOwnership) retryUntil() time.Time {
	if o.raw == nil || !unavailable(o.raw) || o.leaseFrom.Load() == 0 || o.r.g.ctx.Err() != nil {
		return time.Time{}
	}
	if errors.Is(o.raw, errShardDown) || o.r.unusable(o.key) {
		return o.leaseEnd.Add(o.r.g.opts.Linger)
	}
	return o.leaseEnd
}

// goesOn reports whether the final write is to be made again now (see retryUntil).
func (o *remoteOwnership) goesOn() bool { return time.Now().Before(o.retryUntil()) }

// finalRetry is how often a final write Redis did not answer is made again.
const finalRetry = poll.Every

// again makes the final write again every finalRetry while it goes on, until ctx ends.
func (o *remoteOwnership) again(ctx context.Context) error {
	for {
		o.r.awaitVerdict(ctx, o.key)
		if !o.goesOn() || !sleep(ctx, finalRetry) {
			return o.ferr
		}
		o.try()
	}
}
