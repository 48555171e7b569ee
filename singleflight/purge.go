package singleflight

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/wake"
	"github.com/redis/go-redis/v9"
)

// Purges reach every instance's memory over P:invalidate (ADR 0046); a namespace is purged
// by a new namespace generation in its keys (ADR 0047).

var (
	//go:embed lua/purge_ns.lua
	purgeNSSrc    string
	purgeNSScript = redis.NewScript(purgeNSSrc)
)

const (
	// namespaceRefresh: a namespace generation is read again after it, should a message be lost.
	namespaceRefresh = time.Minute
	// purgeMemory: a purged key is not kept in memory again for so long (ADR 0046).
	purgeMemory = 10 * time.Second
	// maxNamespaces bounds the namespace generations kept in memory; the names come from clients.
	maxNamespaces = 10000
)

// invalidation is what a Group knows of purges.
type invalidation struct {
	once   sync.Once
	mu     sync.Mutex
	purged map[string]time.Time // key → when its purge reached this process (monotonic)
	nsGens *lru.Cache[string, nsGeneration]
	epoch  uint64            // counts namespace messages: a read that raced one is not kept
	local  map[string]uint64 // in-memory Group: the namespace generations themselves
	ready  chan struct{}     // closed when the subscription first listens (at once in memory)
}

type nsGeneration struct {
	gen uint64
	at  time.Time
}

func (inv *invalidation) init() {
	inv.once.Do(func() {
		inv.purged = map[string]time.Time{}
		inv.nsGens, _ = lru.New[string, nsGeneration](maxNamespaces)
		inv.local = map[string]uint64{}
		inv.ready = make(chan struct{})
	})
}

func (g *Group) channel() string        { return g.opts.KeyPrefix + ":invalidate" }
func (g *Group) nsKey(ns string) string { return g.opts.KeyPrefix + ":ns:" + ns }

// startInvalidation starts listening for purges made by other instances; New calls it.
func (g *Group) startInvalidation() {
	g.inv.init()
	g.coord.listen()
}

func (m memory) listen() { close(m.g.inv.ready) }

// listen subscribes the purge channel; a confirmation after the first forgets all.
func (r *remote) listen() {
	g := r.g
	subscribed := false // only the receiving goroutine touches it
	_ = r.wake.Listen(g.channel(), wake.Listener{
		Message: g.apply,
		Confirmed: func() {
			if subscribed {
				g.forgetAll()
			} else {
				subscribed = true
				close(g.inv.ready)
			}
			g.observe(Event{Kind: EventSubscribed})
		},
	})
}

// Listening is closed once this Group receives purges from other instances: at once
// without Redis, and when the subscription first answers with Redis.
func (g *Group) Listening() <-chan struct{} {
	g.inv.init()
	return g.inv.ready
}

// apply carries out one purge message: "a KEY" (an answer) or "n GEN NAME" (a namespace).
func (g *Group) apply(msg string) {
	kind, rest, _ := strings.Cut(msg, " ")
	switch kind {
	case "a":
		g.forgetKey(rest)
		g.observe(Event{Kind: EventInvalidated, Op: "answer", Key: rest})
	case "n":
		s, name, _ := strings.Cut(rest, " ")
		gen, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return
		}
		g.inv.mu.Lock()
		g.inv.epoch++
		if e, ok := g.inv.nsGens.Get(name); !ok || gen > e.gen {
			g.inv.nsGens.Add(name, nsGeneration{gen: gen, at: time.Now()})
		}
		g.inv.mu.Unlock()
		g.observe(Event{Kind: EventInvalidated, Op: "namespace"})
	}
}

// forgetKey drops key's answer from this process and keeps it from coming back.
func (g *Group) forgetKey(key string) bool {
	now := time.Now()
	g.inv.mu.Lock()
	if len(g.inv.purged) >= 1024 {
		for k, t := range g.inv.purged {
			if now.Sub(t) >= purgeMemory {
				delete(g.inv.purged, k)
			}
		}
	}
	g.inv.purged[key] = now
	g.inv.mu.Unlock()
	_, found := g.cached(key)
	g.cacheMu.Lock()
	g.cache.remove(key)
	g.cacheMu.Unlock()
	return found
}

// forgetAll drops every answer and namespace generation kept in memory.
func (g *Group) forgetAll() {
	g.inv.mu.Lock()
	g.inv.epoch++
	g.inv.nsGens.Purge()
	g.inv.mu.Unlock()
	g.cacheMu.Lock()
	g.cache.clear()
	g.cacheMu.Unlock()
	g.observe(Event{Kind: EventInvalidated, Op: "all"})
}

func (g *Group) recentlyPurged(key string) bool {
	g.inv.mu.Lock()
	defer g.inv.mu.Unlock()
	t, ok := g.inv.purged[key]
	return ok && time.Since(t) < purgeMemory
}

// Forget drops the stored answer of key in Redis and in every instance's memory, and
// reports whether one was found. A flight in progress is not affected.
func (g *Group) Forget(ctx context.Context, key string) (bool, error) {
	found := g.forgetKey(key)
	g.observe(Event{Kind: EventPurge, Op: "answer", Key: key})
	stored, err := g.coord.forget(ctx, key)
	return found || stored, err
}

func (r *remote) forget(ctx context.Context, key string) (bool, error) {
	n, err := r.rdb.Del(ctx, r.keys(key).result).Result()
	if err != nil {
		return false, fmt.Errorf("singleflight: forget: %w", err)
	}
	if err := r.rdb.Publish(ctx, r.g.channel(), "a "+key).Err(); err != nil {
		return true, fmt.Errorf("singleflight: forget: deleted in Redis, but other instances were not told: %w", err)
	}
	return n > 0, nil
}

// PurgeNamespace starts and returns a new namespace generation of ns: its stored answers
// are out of reach at once.
func (g *Group) PurgeNamespace(ctx context.Context, ns string) (uint64, error) {
	g.observe(Event{Kind: EventPurge, Op: "namespace"})
	return g.coord.purgeNamespace(ctx, ns)
}

func (m memory) purgeNamespace(_ context.Context, ns string) (uint64, error) {
	m.g.inv.mu.Lock()
	defer m.g.inv.mu.Unlock()
	m.g.inv.local[ns]++
	return m.g.inv.local[ns], nil
}

func (r *remote) purgeNamespace(ctx context.Context, ns string) (uint64, error) {
	g := r.g
	ttl := max(g.opts.MaxResultTTL, g.opts.ResultTTL, time.Minute) + g.opts.Linger
	s, err := purgeNSScript.Run(ctx, g.opts.Redis, []string{g.nsKey(ns)}, ttl.Milliseconds()).Text()
	if err != nil {
		return 0, fmt.Errorf("singleflight: purge namespace: %w", err)
	}
	gen, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("singleflight: purge namespace: bad namespace generation %q", s)
	}
	msg := "n " + s + " " + ns
	g.apply(msg)
	if err := g.opts.Redis.Publish(ctx, g.channel(), msg).Err(); err != nil {
		return gen, fmt.Errorf("singleflight: purge namespace: purged in Redis, but other instances were not told: %w", err)
	}
	return gen, nil
}

// ErrNamespaceGenerationUnknown means a namespace's generation could not be read: its answers must
// be neither served nor stored.
var ErrNamespaceGenerationUnknown = errors.New("singleflight: namespace generation unknown")

// NamespaceGeneration returns the generation of namespace ns for the request key, 0 if never
// purged, read from memory after the first time; 0 and ErrNamespaceGenerationUnknown if unknown.
func (g *Group) NamespaceGeneration(ctx context.Context, ns string) (uint64, error) {
	return g.coord.namespaceGeneration(ctx, ns)
}

func (m memory) namespaceGeneration(_ context.Context, ns string) (uint64, error) {
	m.g.inv.mu.Lock()
	defer m.g.inv.mu.Unlock()
	return m.g.inv.local[ns], nil
}

func (r *remote) namespaceGeneration(ctx context.Context, ns string) (uint64, error) {
	g := r.g
	g.inv.mu.Lock()
	e, ok := g.inv.nsGens.Get(ns)
	epoch := g.inv.epoch
	g.inv.mu.Unlock()
	if ok && (time.Since(e.at) < namespaceRefresh || g.degraded.Load()) {
		return e.gen, nil
	}
	if g.degraded.Load() {
		return 0, ErrNamespaceGenerationUnknown
	}
	octx, cancel := r.watchedOp(ctx, g.nsKey(ns))
	gen, err := g.opts.Redis.Get(octx, g.nsKey(ns)).Uint64()
	cancel()
	if errors.Is(err, redis.Nil) {
		gen, err = 0, nil
	}
	if err != nil {
		r.redisErrAt("namespace", g.nsKey(ns), err)
		if ok {
			return e.gen, nil
		}
		return 0, errors.Join(ErrNamespaceGenerationUnknown, err)
	}
	g.inv.mu.Lock()
	if g.inv.epoch == epoch {
		g.inv.nsGens.Add(ns, nsGeneration{gen: gen, at: time.Now()})
	} else if e, ok := g.inv.nsGens.Get(ns); ok {
		gen = e.gen // a purge message came while we read: it is the newer word
	}
	g.inv.mu.Unlock()
	return gen, nil
}
