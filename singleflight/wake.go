package singleflight

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/poll"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/wake"
	"github.com/redis/go-redis/v9"
)

// wakeHub is the Group's wake-up hub (package wake), of stream entries: the root reaches it
// only through wake's API. See ADRs 0012, 0055, 0057.
type wakeHub struct{ *wake.Hub[entry] }

// watch is one follower's subscription to a channel (wake.Watch).
type watch = wake.Watch[entry]

// keepIdleChannels is how long a channel stays subscribed without watchers (ADR 0014).
const keepIdleChannels = 5 * time.Second

// sleep waits d, or until ctx ends (then false).
func sleep(ctx context.Context, d time.Duration) bool { return poll.Sleep(ctx, d) }

func newWakeHub(r *remote) *wakeHub {
	g := r.g
	cfg := wake.Config[entry]{
		Redis: r.rdb, Ctx: g.ctx, WG: &g.wg, // the hub's callers are counted by g.wg, or are New
		AlivePrefix: g.opts.KeyPrefix + ":alive:", Lease: g.opts.LeaseTTL, KeepIdle: keepIdleChannels,
		Decode: decodeEntry,
		Failed: func(err error) { g.observe(Event{Kind: EventRedisError, Op: "subscribe", Err: err}) },
		Heard: func() {
			if g.hooks.aliveHeard != nil {
				g.hooks.aliveHeard()
			}
		},
	}
	if r.sharded() {
		cfg.Node, cfg.Unanswered = r.hubNode, r.hubUnanswered
	}
	return &wakeHub{wake.New(cfg)}
}

// hubKeys is how many keys hubNode looks up to find the Cluster's masters.
const hubKeys = 64

// master is a Cluster master the layout holds, and a key it serves.
type master struct {
	addr, key string
	c         *redis.Client
}

// masters are the masters of hubKeys keys' slots, by address, from the layout the client
// holds (it loads it first if it has none).
func (r *remote) masters() []master {
	c, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.g.ctx, r.g.opts.RedisTimeout)
	defer cancel()
	var ms []master
	for i := range hubKeys {
		key := r.g.opts.KeyPrefix + ":hub:" + strconv.Itoa(i)
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			break // no layout
		}
		if a := m.Options().Addr; !slices.ContainsFunc(ms, func(x master) bool { return x.addr == a }) {
			ms = append(ms, master{addr: a, key: key, c: m})
		}
	}
	slices.SortFunc(ms, func(a, b master) int { return strings.Compare(a.addr, b.addr) })
	return ms
}

// hubNode is where the hub's connection goes in a Cluster: a master not known to fail,
// other than avoid where there is one, picked by the instance's id so that instances
// spread over the masters. Any node hears every PUBLISH (ADRs 0013, 0081). Without a
// layout, go-redis chooses.
func (r *remote) hubNode(avoid string) (redis.UniversalClient, string) {
	ms := r.masters()
	var usable, other []master
	for _, m := range ms {
		switch {
		case m.addr == avoid:
		case r.shardUsable(m.addr):
			usable = append(usable, m)
		default:
			other = append(other, m)
		}
	}
	pick := usable
	for _, more := range [][]master{other, ms} {
		if len(pick) == 0 {
			pick = more
		}
	}
	if len(pick) == 0 {
		return r.rdb, ""
	}
	h := fnv.New32a()
	h.Write([]byte(r.g.opts.InstanceID))
	m := pick[h.Sum32()%uint32(len(pick))]
	return m.c, m.addr
}

// hubUnanswered has a PING confirm whether node, which left the hub's PING unanswered,
// hangs (ADR 0056).
func (r *remote) hubUnanswered(node string) {
	for _, m := range r.masters() {
		if m.addr == node {
			r.confirm(m.key, errSlow)
			return
		}
	}
}
