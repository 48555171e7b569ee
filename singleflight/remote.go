package singleflight

import (
	"context"
	_ "embed"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The protocol's scripts; see the header of each file for its keys, arguments and answer.
var (
	//go:embed lua/lookup.lua
	lookupSrc string
	//go:embed lua/claim.lua
	claimSrc string
	//go:embed lua/renew.lua
	renewSrc string
	//go:embed lua/append.lua
	appendSrc string
	//go:embed lua/complete.lua
	completeSrc string
	//go:embed lua/fail.lua
	failSrc string
	//go:embed lua/incr.lua
	incrSrc string
	//go:embed lua/restore.lua
	restoreSrc string
	//go:embed lua/unwait.lua
	unwaitSrc string
	//go:embed lua/wake.lua
	wakeSrc string
	//go:embed lua/usable.lua
	usableSrc string

	lookupScript   = redis.NewScript(wakeSrc + lookupSrc)
	claimScript    = redis.NewScript(wakeSrc + claimSrc)
	renewScript    = redis.NewScript(wakeSrc + restoreSrc + renewSrc)
	appendScript   = redis.NewScript(wakeSrc + restoreSrc + appendSrc)
	completeScript = redis.NewScript(wakeSrc + restoreSrc + completeSrc)
	failScript     = redis.NewScript(wakeSrc + restoreSrc + failSrc)
	incrScript     = redis.NewScript(incrSrc)
	unwaitScript   = redis.NewScript(unwaitSrc)
	usableScript   = redis.NewScript(usableSrc) // writes and publishes as the others do (ADR 0022)

	// protocolScripts are those the flights run, loaded by Check (ADR 0085).
	protocolScripts = []*redis.Script{lookupScript, claimScript, renewScript, appendScript, completeScript, failScript, incrScript, unwaitScript}
)

// scriptCall is one run of a script in a pipeline, and its answer.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// runPipelined runs calls by SHA in one pipeline, with what also adds. Those a shard answers
// NOSCRIPT (it lost its scripts: a restart, a failover, SCRIPT FLUSH) go again in one
// pipeline, the first of each script with its text (EVAL), which loads it there, the rest by
// SHA behind it: a script's text crosses the link once, not once per call. One answered
// NOSCRIPT again (its shard is not the first's) goes in the next such pipeline; each answers
// its first calls, so they end. See ADR 0085.
func runPipelined(ctx context.Context, rdb redis.UniversalClient, calls []*scriptCall, also func(redis.Pipeliner)) {
	var loading map[*redis.Script]bool // the scripts whose text a pipeline sends; nil: none
	for {
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range calls {
				if loading != nil && !loading[c.script] {
					loading[c.script] = true
					c.cmd = c.script.Eval(ctx, p, c.keys, c.args...)
				} else {
					c.cmd = c.script.EvalSha(ctx, p, c.keys, c.args...)
				}
			}
			if also != nil {
				also(p)
			}
			return nil
		}) // each call's error is its command's
		var again []*scriptCall
		for _, c := range calls {
			if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
				again = append(again, c)
			}
		}
		if len(again) == 0 {
			return
		}
		calls, loading, also = again, map[*redis.Script]bool{}, nil
	}
}

// seqTTL keeps owner-seq from living forever; tokens stay unique without it (ADR 0002).
const seqTTL = 7 * 24 * time.Hour

// seqBlock is how many owner-seq numbers one INCRBY reserves (ADR 0002).
const seqBlock = 64

// remote is the Redis coordinator of a Group.
type remote struct {
	g        *Group
	rdb      redis.UniversalClient
	wake     *wakeHub      // the pub/sub connection followers wait on
	renewer  *renewer      // every owned lease, renewed in one batch
	coalesce coalescer     // lookups and completes, in pipelines when many run at once
	unwaits  unwaits       // marks to take off that Redis did not answer (unwait.go)
	local    atomic.Uint64 // makes tokens unique within this process
	// recheckEvery, if set, caps a follower's wait between looks (tests).
	recheckEvery time.Duration

	// seqLock guards seqNext, seqEnd and seqDownUntil. It is held across a Redis round
	// trip, so it is a channel: a wait on it blocks durably in a synctest bubble, where a
	// sync.Mutex wait would stop the simulator's clock (singleflight/sim).
	seqLock         chan struct{}
	seqNext, seqEnd int64 // the reserved block of owner-seq numbers not used yet: [next, end]

	mu           sync.Mutex      // guards down, suspect, verdict, hung, recovered, probing (seqDownUntil: seqLock), and changes of suspects and Group.degraded
	down         map[string]bool // shards (see shard) that failed and are not answering yet
	suspect      map[string]bool // shards whose timeout is being confirmed (see confirm)
	suspects     atomic.Int32    // len(suspect), read without the lock on every lookup
	verdict      chan struct{}   // closed, and replaced, when a confirmation PING ended
	hung         map[string]bool // down shards that hang rather than refuse (see confirm)
	recovered    time.Time       // when the probe last found every shard answering
	probing      bool
	seqDownUntil time.Time // owner-seq failed: tokens go without a new number until then
}

func newRemote(g *Group) *remote {
	r := &remote{g: g, rdb: g.opts.Redis, down: map[string]bool{}, suspect: map[string]bool{}, hung: map[string]bool{},
		verdict: make(chan struct{}), seqLock: make(chan struct{}, 1)}
	r.wake, r.renewer = newWakeHub(r), newRenewer(r)
	r.coalesce.r = r
	return r
}

// flightKeys share one hash tag, so that one script may touch all three in a Cluster.
type flightKeys struct{ meta, stream, result string }

func (r *remote) keys(key string) flightKeys {
	p := r.g.opts.KeyPrefix
	return flightKeys{
		meta:   p + ":meta:{" + key + "}",
		stream: p + ":stream:{" + key + "}",
		result: p + ":result:{" + key + "}",
	}
}

func (r *remote) seqKey() string { return r.g.opts.KeyPrefix + ":owner-seq" }

// runningTTL keeps a running flight's attempt count past its owner's death.
func (r *remote) runningTTL() int64 {
	return (r.g.opts.LeaseTTL + r.g.opts.Linger).Milliseconds()
}

// lookup asks what a caller of key should do; with a candidate it may claim (ADR 0002).
// A follow marks the flight waited for by callers of this instance (ADR 0074).
func (r *remote) lookup(key string, noCache bool, candidate string, co CallOptions, mark string, callers int) (decision, error) {
	k := r.keys(key)
	o := r.g.opts
	sent := time.Now()
	v, err := r.coalesce.run(lookupScript, []string{k.meta, k.result, k.stream},
		flag(noCache), candidate, o.InstanceID, o.LeaseTTL.Milliseconds(), r.runningTTL(), o.Linger.Milliseconds(),
		co.MaxAge.Milliseconds(), co.Route, co.Model, mark, callers).Slice()
	if err != nil {
		return decision{}, r.redisErr("lookup", key, err)
	}
	return decodeLookup(v, candidate, sent)
}

// newToken returns a fencing token "seq-instance-local", unique even while owner-seq
// cannot be reached (ADR 0002).
func (r *remote) newToken(ctx context.Context) string {
	r.seqLock <- struct{}{}
	defer func() { <-r.seqLock }()
	// While owner-seq's shard is degraded, tokens go on with the last number reserved: no
	// caller waits on a shard the probe watches (ADR 0056).
	if (r.seqNext == 0 || r.seqNext > r.seqEnd) && time.Now().After(r.seqDownUntil) && !r.degradedAt(r.seqKey()) {
		octx, cancel := r.watchedOp(ctx, r.seqKey())
		end, err := incrScript.Run(octx, r.rdb, []string{r.seqKey()}, seqBlock, seqTTL.Milliseconds()).Int64()
		cancel()
		if err == nil {
			r.seqNext, r.seqEnd = end-seqBlock+1, end
		} else if !errors.Is(err, context.Canceled) {
			r.g.observe(Event{Kind: EventRedisError, Op: "incr", Err: err})
			if timedOut(err) { // a hung owner-seq shard trips; a refused owner-seq does not (ADR 0002)
				r.confirm(r.seqKey(), err)
			}
			r.seqDownUntil = time.Now().Add(time.Second) // not a dial timeout per new flight
		}
	}
	seq := r.seqEnd
	if r.seqNext != 0 && r.seqNext <= r.seqEnd {
		seq = r.seqNext
		r.seqNext++
	}
	return strconv.FormatInt(seq, 10) + "-" + r.g.opts.InstanceID + "-" + strconv.FormatUint(r.local.Add(1), 10)
}

// claim takes the flight over if its meta still has the token and state seen (ADR 0003).
func (r *remote) claim(ctx context.Context, key, token string, seen decision, fresh bool, co CallOptions, mark string, callers int) (decision, error) {
	k := r.keys(key)
	o := r.g.opts
	sent := time.Now()
	ctx, cancel := r.watchedOp(ctx, k.meta)
	defer cancel()
	v, err := claimScript.Run(ctx, r.rdb, []string{k.meta, k.stream},
		token, seen.token, o.InstanceID, o.LeaseTTL.Milliseconds(), r.runningTTL(), o.MaxAttempts, flag(fresh),
		seen.seen.state(), o.Linger.Milliseconds(), co.Route, co.Model, mark, callers).Slice()
	if err != nil {
		return decision{}, r.redisErr("claim", key, err)
	}
	return decodeClaim(v, token, sent)
}

// redisErr reports err; one that says Redis is unusable degrades key's shard (ADR 0022).
func (r *remote) redisErr(op, key string, err error) error {
	return r.redisErrAt(op, r.keys(key).meta, err)
}

// redisErrAt is redisErr for the server that holds the Redis key rkey.
func (r *remote) redisErrAt(op, rkey string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, errShardDown) {
		return err
	}
	r.g.observe(Event{Kind: EventRedisError, Op: op, Err: err})
	switch {
	case timedOut(err) || unavailable(err) && r.justRecovered():
		// An operation begun before a recovery may fail after it: a PING decides (ADR 0056).
		r.confirm(rkey, err)
	case unavailable(err):
		r.degrade(r.shardOf(rkey), err)
		r.reloadLayout()
	}
	return err
}

func (r *remote) name() string { return "redis" }

// opContext bounds one Redis operation on a caller's path, retries included (ADR 0056).
func (r *remote) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.g.opts.RedisTimeout)
}

// justRecovered reports whether the probe found Redis answering again less than a
// deadline ago.
func (r *remote) justRecovered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.recovered.IsZero() && time.Since(r.recovered) < r.g.opts.RedisTimeout
}

// errSlow is why a shard was suspected before an operation timed out.
var errSlow = errors.New("singleflight: Redis did not answer within half a deadline")

// watchedOp is opContext for an operation on the server that holds the Redis key rkey: if
// it has not ended at half its deadline, that server is suspected, and a PING confirms
// the hang by the time the operation times out (ADR 0056).
func (r *remote) watchedOp(ctx context.Context, rkey string) (context.Context, context.CancelFunc) {
	return r.watchedUntil(ctx, rkey, time.Now().Add(r.g.opts.RedisTimeout))
}

// watchedUntil is watchedOp for an operation that ends at deadline: its server is
// suspected half a RedisTimeout before it, and the PING's verdict is in by it, never after
// (ADR 0056).
func (r *remote) watchedUntil(ctx context.Context, rkey string, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	t := time.AfterFunc(time.Until(deadline)-r.g.opts.RedisTimeout/2, func() { r.confirmBy(rkey, errSlow, deadline) })
	return ctx, func() { t.Stop(); cancel() }
}
