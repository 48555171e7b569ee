package singleflight

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/clusterclient"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestCompletesAtOnceShareRoundTrips: answers completed at the same moment go to Redis in
// shared pipelines, and each flight still gets its own answer, stored.
func TestCompletesAtOnceShareRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tc := &cmdCounter{match: scriptRuns(completeScript)}
	rdb.AddHook(tc)
	owner := New(Options{Redis: rdb, ResultTTL: time.Minute})
	t.Cleanup(func() { owner.Close(context.Background()) })
	const n = 200
	gate := make(chan struct{})
	keys, readers := ownEach(t, owner, n, func(i int) Func {
		return func(ctx context.Context, w *Writer) (Result, error) {
			<-gate
			return Result{Head: Head{Status: 200}, Body: fmt.Appendf(nil, `{"n":%d}`, i)}, nil
		}
	})
	// Loaded first: pipelines sent at once to a Redis without the script would each meet
	// NOSCRIPT and send their calls again.
	if err := completeScript.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	tc.n.Store(0)
	tc.calls.Store(0)
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, r := range readers {
		if o := readAll(ctx, r); o.err != nil || o.body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("flight %d: %+v", i, o)
		}
	}
	if c := tc.calls.Load(); c != n {
		t.Fatalf("%d completes sent; want %d", c, n)
	}
	if trips := tc.n.Load(); trips > n/2 {
		t.Fatalf("%d completes took %d round trips; want them shared", n, trips)
	}
	other := New(Options{Redis: srv.Client(), ResultTTL: time.Minute})
	t.Cleanup(func() { other.Close(context.Background()) })
	for i, k := range keys {
		if o := doAll(t, other, k, 1, instant)()[0]; o.role != RoleHit || o.body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("stored answer %d: %+v", i, o)
		}
	}
}

// outCounter is a client hook counting the commands that match sent and not answered yet.
type outCounter struct {
	match func(redis.Cmder) bool
	n     atomic.Int64
}

func (c *outCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *outCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !c.match(cmd) {
			return next(ctx, cmd)
		}
		c.n.Add(1)
		defer c.n.Add(-1)
		return next(ctx, cmd)
	}
}

func (c *outCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, c.match) {
			return next(ctx, cmds)
		}
		c.n.Add(1)
		defer c.n.Add(-1)
		return next(ctx, cmds)
	}
}

// TestHungMasterDelaysNoOtherMastersLookups: in a Cluster whose master X hangs, a herd of
// lookups of X's keys takes every pipeline X may have, while a herd of keys of a healthy
// master, owned on another instance, looks up at the same time: the healthy herd follows
// that owner at once, with no wait for X, and each of its keys costs one upstream call;
// X alone is found down. See ADRs 0016, 0022, 0063.
func TestHungMasterDelaysNoOtherMastersLookups(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Minute})
	o := Options{RedisTimeout: 2 * time.Second, LeaseTTL: 5 * time.Second, HeartbeatInterval: time.Second}
	out := &outCounter{match: scriptCalls(lookupScript)}
	rec := newRecorder()
	group := func(name string, hook redis.Hook) *Group {
		oc := o
		if hook != nil {
			oc.Observer = rec
		}
		rdb := clusterclient.New(&redis.ClusterOptions{Addrs: c.Addrs(), ClientName: name, ReadTimeout: o.RedisTimeout,
			WriteTimeout: o.RedisTimeout, ContextTimeoutEnabled: true, MaxRetries: 2, DialerRetries: 1})
		if hook != nil {
			rdb.AddHook(hook)
		}
		oc.Redis = rdb
		g := New(oc)
		t.Cleanup(func() { g.Close(context.Background()); rdb.Close() })
		<-g.Listening()
		return g
	}
	a, b := group("a", out), group("b", nil)
	masters, err := c.Masters()
	if err != nil {
		t.Fatal(err)
	}
	// X holds neither instance's pub/sub connection: what waits on X is the coalescer alone.
	subs := map[*redistest.Server]bool{}
	for _, m := range masters {
		list, err := m.Client().ClientList(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, "cmd=subscribe") {
				subs[m] = true
			}
		}
	}
	var x, y *redistest.Server
	for _, m := range masters {
		switch {
		case !subs[m] && x == nil:
			x = m
		case y == nil:
			y = m
		}
	}
	if x == nil || y == nil || x == y {
		t.Fatalf("no master free of pub/sub connections, and another: %v", subs)
	}
	keysOn := func(m *redistest.Server, n int) []string {
		var keys []string
		for i := 0; len(keys) < n; i++ {
			k := fmt.Sprintf("%s-%d", uniqueKey(), i)
			if got, err := c.MasterOf(a.rem().keys(k).meta); err == nil && got == m {
				keys = append(keys, k)
			}
		}
		return keys
	}
	hung, healthy := keysOn(x, 2*maxPipelines), keysOn(y, 8)

	// B owns the healthy keys, held until the end.
	owned := newReply("b's answer")
	release := once(owned.release)
	t.Cleanup(release)
	own(t, b, healthy, owned)

	a.rem().newToken(context.Background()) // A's block of owner-seq numbers, wherever it lives, is reserved
	x.Pause()
	t.Cleanup(x.Resume)
	local := newReply("a's own")
	local.release()
	for i, k := range hung {
		for range 3 {
			r, err := a.Do(k, false, local.fn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
		}
		if i < maxPipelines { // each alone in a pipeline slot; the others queue behind them
			waitCond(t, 5*time.Second, fmt.Sprintf("X's lookup %d sent", i), func() bool { return out.n.Load() >= int64(i+1) })
		}
	}

	start := time.Now()
	own := newReply("a's own call of a healthy key")
	own.release()
	readers := make([]*Reader, 0, 3*len(healthy))
	for _, k := range healthy {
		for range 3 {
			r, err := a.Do(k, false, own.fn)
			if err != nil {
				t.Fatal(err)
			}
			readers = append(readers, r)
		}
	}
	roles := map[string]Role{}
	rec.waitMatch(t, "a role for each of A's flights of the healthy keys", func(e Event) bool {
		if e.Kind == EventRole && slices.Contains(healthy, e.Key) {
			roles[e.Key] = e.Role
		}
		return len(roles) == len(healthy)
	}, 10*time.Second)
	took := time.Since(start)
	for k, role := range roles {
		if role != RoleFollower {
			t.Errorf("A's flight of healthy key %s is %v after %v; want a follower of B's", k, role, took)
		}
	}
	if took >= o.RedisTimeout/2 {
		t.Errorf("A's flights of the healthy master's keys followed after %v; want well within half a deadline (%v): no wait for X", took, o.RedisTimeout/2)
	}
	release()
	for _, r := range readers {
		if got := readWithin(r, 10*time.Second); got.err != nil || got.body != "b's answer" {
			t.Fatalf("a caller of a healthy key on A got (%q, %v, %v); want B's answer", got.body, got.role, got.err)
		}
	}
	if n := own.calls.Load() + owned.calls.Load(); n != int32(len(healthy)) {
		t.Fatalf("%d upstream calls for %d healthy keys (%d of them A's own); want one each", n, len(healthy), own.calls.Load())
	}
	// X, and X alone, is found down once its calls' deadline has passed.
	rec.waitFor(t, EventShardDown, 1, 10*time.Second)
	var down []string
	for _, e := range rec.eventsOf(EventShardDown) {
		down = append(down, e.Op)
	}
	if len(down) != 1 || port(down[0]) != port(x.Addr) { // a loopback node is named ":port" (internal/clusterclient)
		t.Fatalf("shards down %q; want X alone, %s (Y is %s)", down, x.Addr, y.Addr)
	}
}

// port is the port of the address addr.
func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// gate is a client hook that holds every command that match accepts until opened or its
// context ends, as a Redis that hangs does, and counts those it held.
type gate struct {
	match func(redis.Cmder) bool
	open  chan struct{}
	held  atomic.Int64
}

func (h *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			h.held.Add(1)
			select {
			case <-h.open:
			case <-ctx.Done():
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func (h *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, h.match) {
			h.held.Add(1)
			select {
			case <-h.open:
			case <-ctx.Done():
				return failAll(cmds, ctx.Err())
			}
		}
		return next(ctx, cmds)
	}
}

// TestCallsOfAShardThatGoesDownEndAtOnce: the calls of a shard that goes down end at once
// with errShardDown, before their deadlines: those sent, and those queued, which are never
// sent; a call made while its shard is down is not sent either. No caller waits on a shard
// the probe watches (ADRs 0056, 0063).
func TestCallsOfAShardThatGoesDownEndAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	if err := incrScript.Load(context.Background(), rdb).Err(); err != nil { // each call one EVALSHA
		t.Fatal(err)
	}
	held := &gate{match: scriptCalls(incrScript), open: make(chan struct{})}
	sent := &cmdCounter{match: scriptCalls(incrScript)}
	rdb.AddHook(sent)
	rdb.AddHook(held)
	g := backend{}.group(t, Options{Redis: rdb, RedisTimeout: time.Minute})
	stopProbe := make(chan struct{})
	g.hooks.probed = func() { <-stopProbe } // the shard stays down until the test ends
	t.Cleanup(once(func() { close(stopProbe) }))
	open := once(func() { close(held.open) })
	t.Cleanup(open)
	r := g.rem()
	run := func(key string) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- r.coalesce.run(incrScript, []string{key}, 1, 60000).Err() }()
		return ch
	}
	var out []<-chan error
	for i := range maxPipelines {
		out = append(out, run(fmt.Sprintf("%s-%d", uniqueKey(), i)))
		waitCond(t, 5*time.Second, "a call in every pipeline slot", func() bool { return held.held.Load() == int64(i+1) })
	}
	queued := run(uniqueKey())
	waitCond(t, 5*time.Second, "a call queued behind them", func() bool {
		r.coalesce.mu.Lock()
		defer r.coalesce.mu.Unlock()
		q := r.coalesce.shards[""]
		return q != nil && len(q.queue) == 1
	})

	r.degrade("", errors.New("test: down"))
	for i, ch := range append(out, queued) {
		select {
		case err := <-ch:
			if !errors.Is(err, errShardDown) {
				t.Fatalf("call %d ended with %v; want errShardDown", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("call %d of a down shard (the last queued, the others sent) still waits after 5s; want it ended at once", i)
		}
	}
	open()
	if err := <-run(uniqueKey()); !errors.Is(err, errShardDown) {
		t.Fatalf("a call made while its shard is down ended with %v; want errShardDown", err)
	}
	if n := sent.calls.Load(); n != maxPipelines {
		t.Fatalf("%d calls sent; want %d, those sent before the shard went down", n, maxPipelines)
	}
}

// TestPipelinedCallsOfARedisThatLostItsScriptsAreAnswered: calls sharing a pipeline to a
// Redis that lost its scripts (a restart, SCRIPT FLUSH) each get NOSCRIPT, and are then sent
// again in one pipeline, the script's text with the first alone, and each answered, once.
func TestPipelinedCallsOfARedisThatLostItsScriptsAreAnswered(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	g := backend{}.group(t, Options{Redis: rdb})
	r := g.rem()
	if err := r.coalesce.run(incrScript, []string{uniqueKey()}, 1, 60000).Err(); err != nil { // the script loaded
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	pipelined := &cmdCounter{match: scriptRuns(incrScript)}
	texts := &cmdCounter{match: func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return len(a) > 1 && a[0] == "eval" && a[1] == incrSrc
	}}
	all := &cmdCounter{match: scriptCalls(incrScript)}
	rdb.AddHook(pipelined)
	rdb.AddHook(texts)
	rdb.AddHook(all)
	const n = 3
	batch := make([]*queuedCall, n)
	for i := range batch {
		batch[i] = &queuedCall{scriptCall: scriptCall{script: incrScript, keys: []string{uniqueKey()}, args: []any{i + 1, 60000}},
			deadline: time.Now().Add(g.opts.RedisTimeout), done: make(chan struct{})}
	}
	r.coalesce.send(&shardQueue{out: map[*outPipeline]bool{}}, batch)
	if pipelined.n.Load() == 0 || pipelined.calls.Load() < n {
		t.Fatalf("%d EVALSHAs in %d round trips; want the %d calls sent in one pipeline first", pipelined.calls.Load(), pipelined.n.Load(), n)
	}
	for i, c := range batch {
		<-c.done
		if v, err := c.cmd.Int64(); err != nil || v != int64(i+1) {
			t.Fatalf("call %d: (%d, %v); want %d", i, v, err, i+1)
		}
		if got := rdb.Get(context.Background(), c.keys[0]).Val(); got != fmt.Sprint(i+1) {
			t.Fatalf("key of call %d holds %q; want %d: each call run once", i, got, i+1)
		}
	}
	if n := texts.calls.Load(); n != 1 {
		t.Errorf("the script's text sent %d times; want once", n)
	}
	if n := all.n.Load(); n != 2 {
		t.Errorf("%d round trips; want 2: the pipeline, and one pipeline again", n)
	}
}
