package singleflight

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	//go:embed lua/wake.lua
	wakeSrc string

	lookupScript   = redis.NewScript(wakeSrc + lookupSrc)
	claimScript    = redis.NewScript(wakeSrc + claimSrc)
	renewScript    = redis.NewScript(wakeSrc + restoreSrc + renewSrc)
	appendScript   = redis.NewScript(wakeSrc + restoreSrc + appendSrc)
	completeScript = redis.NewScript(wakeSrc + restoreSrc + completeSrc)
	failScript     = redis.NewScript(wakeSrc + restoreSrc + failSrc)
	incrScript     = redis.NewScript(incrSrc)
)

// seqTTL keeps the owner-seq counter from living forever; tokens stay unique after it
// expires because they also carry the instance id and a local counter.
const seqTTL = 7 * 24 * time.Hour

// seqBlock is how many owner sequence numbers one INCRBY reserves: a claim then costs no
// round trip of its own, and each owner still has a number of the global counter.
const seqBlock = 64

// remote is the Redis coordinator of a Group.
type remote struct {
	g       *Group
	rdb     redis.UniversalClient
	wake    *wakeHub      // the pub/sub connection followers wait on
	renewer *renewer      // every owned lease, renewed in one batch
	batch   batcher       // lookups and completes, in pipelines when many run at once
	local   atomic.Uint64 // makes tokens unique within this process
	// recheckEvery, if set, caps how long a follower waits without looking the flight up
	// (tests: to make a follower look again while its owner is alive but silent).
	recheckEvery time.Duration

	seqMu           sync.Mutex
	seqNext, seqEnd int64 // the reserved block of owner-seq numbers not used yet: [next, end]

	mu           sync.Mutex      // guards down and probing, and changes of Group.degraded
	down         map[string]bool // shards (see shard) that failed and are not answering yet
	probing      bool
	seqDownUntil time.Time // owner-seq failed: tokens go without a new number until then
}

func newRemote(g *Group) *remote {
	r := &remote{g: g, rdb: g.opts.Redis, down: map[string]bool{}}
	r.wake, r.renewer = newWakeHub(r), newRenewer(r)
	r.batch.r = r
	return r
}

// keys of one flight: one hash tag, so that one script may touch all three in a Cluster.
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

// ttl of a running flight's meta and stream: long enough that the attempt count survives
// an owner's death; the lease, not this TTL, decides when a takeover may happen.
func (r *remote) runningTTL() int64 {
	return (r.g.opts.LeaseTTL + r.g.opts.Linger).Milliseconds()
}

// decision is the answer of lookup or claim.
type decision struct {
	kind      string // hit, follow, claim, owner, changed, exhausted
	token     string // follow: the owner's; claim: the one seen; hit: the one that stored it
	remaining time.Duration
	gen       string // stream ID of the generation's first entry
	attempt   int
	batches   int    // follow: batches the owner appended so far (-1: not known)
	until     int64  // owner: lease_until, Redis time in ms
	reason    string // claim: absent, expired, failed, done
	head      Head   // hit
	body      []byte // hit
	age       time.Duration
	ttl       time.Duration // hit: its whole time to live, age included (0: unknown)
	clock     clockRef      // owner and follow: Redis's clock when the script ran (see answered.go)
	landed    int64         // hit: when the stored answer's complete ran, Redis's clock in µs
}

// lookup asks what a caller of key should do; with a candidate token it may claim the
// flight at once (answer "owner"; the caller then uses the token up). It goes out in a
// shared pipeline (batcher), bounded by the write timeout, not by a caller's context.
func (r *remote) lookup(key string, noCache bool, candidate string, co CallOptions) (decision, error) {
	k := r.keys(key)
	o := r.g.opts
	sent := time.Now()
	v, err := r.batch.run(lookupScript, []string{k.meta, k.result, k.stream},
		flag(noCache), candidate, o.InstanceID, o.LeaseTTL.Milliseconds(), r.runningTTL(), o.Linger.Milliseconds(),
		co.MaxAge.Milliseconds(), co.Route, co.Model).Slice()
	if err != nil {
		return decision{}, r.redisErr("lookup", key, err)
	}
	d := decision{kind: str(v, 0), clock: clockRef{sent: sent}}
	switch d.kind {
	case "hit":
		d.head, err = decodeHead(str(v, 1), str(v, 2))
		d.body = []byte(str(v, 3))
		d.age = time.Duration(num(v, 4)) * time.Millisecond
		d.token = str(v, 5)
		if left := num(v, 6); left > 0 {
			d.ttl = d.age + time.Duration(left)*time.Millisecond
		}
		d.landed = num(v, 7)
	case "follow":
		d.token, d.remaining, d.gen, d.attempt = str(v, 1), time.Duration(num(v, 2))*time.Millisecond, str(v, 3), int(num(v, 4))
		d.batches = -1
		if len(v) > 5 {
			d.batches = int(num(v, 5))
		}
		d.clock.us = num(v, 6)
	case "claim":
		d.token, d.attempt, d.reason, d.gen = str(v, 1), int(num(v, 2)), str(v, 3), str(v, 4)
	case "owner":
		d.token, d.attempt, d.gen, d.until, d.clock.us = candidate, int(num(v, 1)), str(v, 2), num(v, 3), num(v, 4)
	default:
		err = fmt.Errorf("singleflight: lookup: unexpected answer %q", d.kind)
	}
	return d, err
}

// newToken returns a fencing token, never handed out before by this process: a number of
// the owner-seq counter (from a block reserved with INCRBY), made unique by the instance id
// and a local counter, because after a failover the counter can hand out a number again.
// A token offered to a lookup that did not claim is simply never used.
//
// Scripts compare whole tokens for equality, never their numbers' order, so when owner-seq
// cannot be reached (its Cluster shard is failing over) tokens go on with the last number
// reserved: still unique, and flights on the healthy shards keep their distributed dedupe.
func (r *remote) newToken(ctx context.Context) string {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	if (r.seqNext == 0 || r.seqNext > r.seqEnd) && time.Now().After(r.seqDownUntil) {
		end, err := incrScript.Run(ctx, r.rdb, []string{r.seqKey()}, seqBlock, seqTTL.Milliseconds()).Int64()
		if err == nil {
			r.seqNext, r.seqEnd = end-seqBlock+1, end
		} else if !errors.Is(err, context.Canceled) {
			r.g.observe(Event{Kind: EventRedisError, Op: "incr", Err: err})
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

// claim takes the flight over with token, if its meta is still what the lookup seen
// answered: the same token in the same state.
func (r *remote) claim(ctx context.Context, key, token string, seen decision, fresh bool, co CallOptions) (decision, error) {
	k := r.keys(key)
	o := r.g.opts
	sent := time.Now()
	v, err := claimScript.Run(ctx, r.rdb, []string{k.meta, k.stream},
		token, seen.token, o.InstanceID, o.LeaseTTL.Milliseconds(), r.runningTTL(), o.MaxAttempts, flag(fresh),
		seenState[seen.reason], o.Linger.Milliseconds(), co.Route, co.Model).Slice()
	if err != nil {
		return decision{}, r.redisErr("claim", key, err)
	}
	d := decision{kind: str(v, 0), clock: clockRef{sent: sent}}
	switch d.kind {
	case "owner":
		d.token, d.attempt, d.gen, d.until, d.clock.us = token, int(num(v, 1)), str(v, 2), num(v, 3), num(v, 4)
	case "follow":
		d.token, d.remaining, d.gen, d.attempt = str(v, 1), time.Duration(num(v, 2))*time.Millisecond, str(v, 3), int(num(v, 4))
		d.batches = -1 // not known: the follower reads the stream at once
		d.clock.us = num(v, 5)
	case "changed", "exhausted":
	default:
		err = fmt.Errorf("singleflight: claim: unexpected answer %q", d.kind)
	}
	return d, err
}

// seenState is the meta state a lookup's claim reason stands for.
var seenState = map[string]string{"absent": "", "expired": "R", "failed": "F", "done": "D"}

// redisErr reports a failed command on key's flight and returns err. An error that says
// Redis cannot be used (network, timeouts, a server loading or failing over) degrades the
// shard that holds key at once, so that no request waits for its own timeout to find out.
func (r *remote) redisErr(op, key string, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	r.g.observe(Event{Kind: EventRedisError, Op: op, Err: err})
	if unavailable(err) {
		r.degrade(r.shard(key), err)
		r.reloadLayout()
	}
	return err
}

// unavailable tells errors of an unreachable or unusable server from replies to a command.
// Authentication and permission errors (a wrong or missing password, an ACL user that may
// not run the scripts) make Redis as unusable as a network error, for every command, until
// the configuration is fixed; so do TLS errors (not redis.Error: they fall through).
func unavailable(err error) bool {
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return false // this process is busy, Redis is not down: only that flight goes local
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return Refused(err) != NotRefused
	}
	return true
}

// Refusal is how Redis refuses the proxy's configuration rather than one command: every
// command meets it until the configuration (or the server's role) changes.
type Refusal int

const (
	NotRefused        Refusal = iota
	RefusedAuth               // a wrong or missing password (NOAUTH, WRONGPASS)
	RefusedPermission         // an ACL user that may not run a command, or publish on a channel (Redis 7 gives new users none)
	RefusedDB                 // redis.db out of range: every connection's SELECT fails
	RefusedNotCluster         // several addresses naming a server that is no Cluster
	RefusedReadOnly           // a read-only replica
)

// Refused names err's refusal, or NotRefused.
func Refused(err error) Refusal {
	var re redis.Error
	if !errors.As(err, &re) {
		return NotRefused
	}
	msg := re.Error()
	switch {
	case strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "WRONGPASS"):
		return RefusedAuth
	case strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "The user executing the script can't"):
		return RefusedPermission
	case strings.Contains(msg, "DB index is out of range"):
		return RefusedDB
	case strings.Contains(msg, "cluster support disabled"):
		return RefusedNotCluster
	case strings.HasPrefix(msg, "READONLY"):
		return RefusedReadOnly
	}
	return NotRefused
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func str(v []any, i int) string {
	if i >= len(v) {
		return ""
	}
	switch x := v[i].(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

func num(v []any, i int) int64 {
	if i >= len(v) {
		return 0
	}
	switch x := v[i].(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func decodeHead(status, header string) (Head, error) {
	s, err := strconv.Atoi(status)
	if err != nil {
		return Head{}, fmt.Errorf("singleflight: bad stored status %q", status)
	}
	h := Head{Status: s}
	if header != "" {
		var err error
		if h.Header, err = decodeHeader(header); err != nil {
			return Head{}, fmt.Errorf("singleflight: bad stored header: %w", err)
		}
	}
	return h, nil
}
