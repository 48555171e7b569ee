package singleflight

import (
	"context"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/poll"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/wake"
)

// wakeHub is the Group's wake-up hub (package wake), of stream entries: the root reaches it
// only through wake's API. See ADRs 0012, 0055, 0057.
type wakeHub struct{ *wake.Hub[entry] }

// watch is one follower's subscription to a channel (wake.Watch).
type watch = wake.Watch[entry]

// keepIdleChannels is how long a channel stays subscribed without watchers (ADR 0014).
const keepIdleChannels = 5 * time.Second

// pollEvery is how often a follower reads its stream while the pub/sub connection is down.
const pollEvery = poll.Every

// sleep waits d, or until ctx ends (then false).
func sleep(ctx context.Context, d time.Duration) bool { return poll.Sleep(ctx, d) }

func newWakeHub(r *remote) *wakeHub {
	g := r.g
	return &wakeHub{wake.New(wake.Config[entry]{
		Redis: r.rdb, Ctx: g.ctx, WG: &g.wg, // the hub's callers are counted by g.wg, or are New
		AlivePrefix: g.opts.KeyPrefix + ":alive:", Lease: g.opts.LeaseTTL, KeepIdle: keepIdleChannels,
		Decode: decodeEntry,
		Failed: func(err error) { g.observe(Event{Kind: EventRedisError, Op: "subscribe", Err: err}) },
		Heard: func() {
			if g.hooks.aliveHeard != nil {
				g.hooks.aliveHeard()
			}
		},
	})}
}
