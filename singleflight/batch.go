package singleflight

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// batcher sends the scripts that many flights run at the same moment in shared pipelines:
// group commit. A call that finds fewer than maxPipelines pipelines out sends at once,
// alone if nothing else waits, so a lone request pays nothing for it; calls that come
// while pipelines are out go in the next one. Under a herd (ten thousand answers completed
// at once, or many clients' lookups) that is one round trip, and one write and one read
// system call, per batch rather than per call. go-redis splits a Cluster pipeline by node.
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
}

const (
	maxPipelines = 4   // out at once, as for renewals
	maxBatch     = 256 // calls in one pipeline
)

// run runs script as script.Run would, in a pipeline shared with calls made meanwhile. The
// call is bounded by the Group's write timeout rather than a caller's context: once queued,
// it goes out whatever its caller does (as a final write must).
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
	<-c.done
	return c.cmd
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
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout(b.r.g))
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
			// A Redis that lost its scripts (a restart, a failover): Run sends the
			// script itself.
			c.cmd = c.script.Run(ctx, rdb, c.keys, c.args...)
		}
		close(c.done)
	}
}
