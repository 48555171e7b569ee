package singleflight

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the scripts many flights run at once in shared pipelines; a lone call goes
// at once. See ADR 0016.
type batcher struct {
	r *remote

	mu       sync.Mutex
	queue    []*batchCall
	inflight int // pipelines out
}

type batchCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	done   chan struct{}
	late   atomic.Bool // its caller stopped waiting: not sent
}

const (
	maxPipelines = 4   // out at once, as for renewals
	maxBatch     = 256 // calls in one pipeline
)

// run runs script in a shared pipeline; once queued, it goes out whatever its caller does.
func (b *batcher) run(script *redis.Script, keys []string, args ...any) *redis.Cmd {
	c := &batchCall{script: script, keys: keys, args: args, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	send := b.inflight < maxPipelines
	if send {
		b.inflight++
	}
	b.mu.Unlock()
	if send {
		b.sendNext()
	}
	select {
	case <-c.done:
		return c.cmd
	default:
	}
	// Queued behind pipelines that do not come back: one deadline from the call, queue
	// included, is all its caller waits (ADR 0056).
	t := time.NewTimer(b.r.g.opts.RedisTimeout)
	defer t.Stop()
	select {
	case <-c.done:
		return c.cmd
	case <-t.C:
		c.late.Store(true)
		cmd := redis.NewCmd(context.Background())
		cmd.SetErr(context.DeadlineExceeded)
		return cmd
	}
}

// sendNext sends one pipeline of what is queued; a goroutine sends the next if more came.
func (b *batcher) sendNext() {
	b.mu.Lock()
	n := min(len(b.queue), maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	b.mu.Unlock()
	if n > 0 {
		b.send(batch)
	}
	b.mu.Lock()
	more := len(b.queue) > 0
	if !more {
		b.inflight--
	}
	b.mu.Unlock()
	if more {
		go b.sendNext()
	}
}

func (b *batcher) send(batch []*batchCall) {
	rdb := b.r.rdb
	// A call whose shard went down while it queued is not sent: one deadline is all its
	// caller waits (ADR 0056).
	batch = slices.DeleteFunc(batch, func(c *batchCall) bool {
		if c.late.Load() {
			close(c.done)
			return true
		}
		if !b.r.degradedAt(c.keys[0]) {
			return false
		}
		c.cmd = redis.NewCmd(context.Background())
		c.cmd.SetErr(errShardDown)
		close(c.done)
		return true
	})
	if len(batch) == 0 {
		return
	}
	// Watched on a call that is sent: a down shard's is not confirmed again.
	ctx, cancel := b.r.watchedOp(context.Background(), batch[0].keys[0])
	defer cancel()
	if len(batch) == 1 {
		c := batch[0]
		c.cmd = c.script.Run(ctx, rdb, c.keys, c.args...)
		close(c.done)
		return
	}
	pipe := rdb.Pipeline()
	for _, c := range batch {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each call's error is its command's
	for _, c := range batch {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			// A Redis that lost its scripts: Run sends the script itself.
			c.cmd = c.script.Run(ctx, rdb, c.keys, c.args...)
		}
		close(c.done)
	}
}
