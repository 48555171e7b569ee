package singleflight

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// coalescer sends the scripts many flights run at once in shared pipelines; a lone call goes
// at once. Each shard (see remote.shard) has its own queue and pipelines: a Cluster master
// that hangs holds up its own calls, never another master's. See ADRs 0016, 0063.
type coalescer struct {
	r *remote

	mu     sync.Mutex
	shards map[string]*shardQueue // by shard; an idle one is dropped
}

// shardQueue is one shard's calls waiting for a pipeline, and its pipelines out; b.mu
// guards it.
type shardQueue struct {
	shard    string
	queue    []*queuedCall
	inflight int                   // pipelines out
	out      map[*outPipeline]bool // those sent, until they return
}

// outPipeline is a pipeline sent; shed cuts it when its shard is found down.
type outPipeline struct {
	cancel context.CancelFunc
	shed   atomic.Bool
}

type queuedCall struct {
	scriptCall
	deadline time.Time // one deadline from when it was queued (ADR 0056)
	done     chan struct{}
	late     atomic.Bool // its caller stopped waiting: not sent
}

const (
	maxPipelines = 4   // out at once per shard, as for renewals
	maxBatch     = 256 // calls in one pipeline
)

// run runs script in a shared pipeline of its shard; once queued, it goes out whatever its
// caller does, unless its shard is down or its deadline passed first.
func (b *coalescer) run(script *redis.Script, keys []string, args ...any) *redis.Cmd {
	c := &queuedCall{scriptCall: scriptCall{script: script, keys: keys, args: args}, done: make(chan struct{}),
		deadline: time.Now().Add(b.r.g.opts.RedisTimeout)}
	shard := b.r.shardOf(keys[0])
	b.mu.Lock()
	q := b.shards[shard]
	if q == nil {
		if b.shards == nil {
			b.shards = map[string]*shardQueue{}
		}
		q = &shardQueue{shard: shard, out: map[*outPipeline]bool{}}
		b.shards[shard] = q
	}
	q.queue = append(q.queue, c)
	send := q.inflight < maxPipelines
	if send {
		q.inflight++
	}
	b.mu.Unlock()
	if send {
		b.sendNext(q)
	}
	select {
	case <-c.done:
		return c.cmd
	default:
	}
	// Queued behind pipelines that do not come back: one deadline from the call, queue
	// included, is all its caller waits (ADR 0056).
	t := time.NewTimer(time.Until(c.deadline))
	defer t.Stop()
	select {
	case <-c.done:
		return c.cmd
	case <-t.C:
		c.late.Store(true)
		return failedCmd(context.DeadlineExceeded)
	}
}

func failedCmd(err error) *redis.Cmd {
	cmd := redis.NewCmd(context.Background())
	cmd.SetErr(err)
	return cmd
}

// sendNext sends one pipeline of what q holds; a goroutine sends the next if more came.
func (b *coalescer) sendNext(q *shardQueue) {
	b.mu.Lock()
	n := min(len(q.queue), maxBatch)
	calls := q.queue[:n:n]
	q.queue = q.queue[n:]
	if len(q.queue) == 0 {
		q.queue = nil
	}
	b.mu.Unlock()
	if n > 0 {
		b.send(q, calls)
	}
	b.mu.Lock()
	more := len(q.queue) > 0
	if !more {
		q.inflight--
		if q.inflight == 0 && b.shards[q.shard] == q {
			delete(b.shards, q.shard)
		}
	}
	b.mu.Unlock()
	if more {
		go b.sendNext(q)
	}
}

// shed ends at once the calls of a shard found down ("": every shard), queued or sent:
// their callers need not wait out their own deadlines (ADR 0063).
func (b *coalescer) shed(shard string) {
	b.mu.Lock()
	var dropped []*queuedCall
	for s, q := range b.shards {
		if shard == "" || s == shard {
			dropped = append(dropped, q.queue...)
			q.queue = nil
			for p := range q.out {
				p.shed.Store(true)
				p.cancel()
			}
		}
	}
	b.mu.Unlock()
	for _, c := range dropped {
		c.cmd = failedCmd(errShardDown)
		close(c.done)
	}
}

func (b *coalescer) send(q *shardQueue, calls []*queuedCall) {
	// No command goes to a suspected shard: its PING decides first (ADR 0056).
	if first := earliest(calls); time.Now().Before(first) {
		ctx, cancel := context.WithDeadline(context.Background(), first)
		b.r.awaitShard(ctx, q.shard)
		cancel()
	}
	// A call whose shard went down while it queued is not sent, nor one whose deadline
	// passed: one deadline is all its caller waits (ADR 0056).
	now := time.Now()
	calls = slices.DeleteFunc(calls, func(c *queuedCall) bool {
		switch {
		case c.late.Load():
		case !now.Before(c.deadline):
			c.cmd = failedCmd(context.DeadlineExceeded)
		case b.r.degradedAt(c.keys[0]):
			c.cmd = failedCmd(errShardDown)
		default:
			return false
		}
		close(c.done)
		return true
	})
	if len(calls) == 0 {
		return
	}
	// Watched on a call that is sent, until the first deadline of the calls: its verdict
	// is in by then.
	ctx, cancel := b.r.watchedUntil(context.Background(), calls[0].keys[0], earliest(calls))
	defer cancel()
	p := &outPipeline{cancel: cancel}
	b.mu.Lock()
	q.out[p] = true
	b.mu.Unlock()
	b.exec(ctx, calls)
	b.mu.Lock()
	delete(q.out, p)
	b.mu.Unlock()
	for _, c := range calls {
		if p.shed.Load() && c.cmd.Err() != nil {
			c.cmd = failedCmd(errShardDown)
		}
		close(c.done)
	}
}

// exec runs calls's calls, in one pipeline if there are several.
func (b *coalescer) exec(ctx context.Context, calls []*queuedCall) {
	rdb := b.r.rdb
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, rdb, c.keys, c.args...)
		return
	}
	sc := make([]*scriptCall, len(calls))
	for i, c := range calls {
		sc[i] = &c.scriptCall
	}
	runPipelined(ctx, rdb, sc, nil)
}

// earliest is the first deadline of calls's calls.
func earliest(calls []*queuedCall) time.Time {
	first := calls[0].deadline
	for _, c := range calls[1:] {
		if c.deadline.Before(first) {
			first = c.deadline
		}
	}
	return first
}
