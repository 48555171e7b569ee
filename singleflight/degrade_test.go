package singleflight

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A Redis that answers PING but refuses every command the proxy sends is a configuration
// to fix, shown at start-up as degraded, and stays degraded: a read-only replica named as
// the server, a database index out of range, several addresses (a Cluster client) naming
// a server that is no Cluster. Check and the probe ask with a write, as the proxy's scripts
// do, not with a PING, which such a server answers (see usableScript).
func TestRedisThatRefusesTheProxyStaysDegraded(t *testing.T) {
	master := redistest.Start(t)
	_, port, _ := strings.Cut(master.Addr, ":")
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", port}})
	cases := map[string]func() redis.UniversalClient{
		"read-only replica": func() redis.UniversalClient { return replica.Client() },
		"db out of range": func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: master.Addr, DB: 99, MaxRetries: 1})
		},
		"ACL user without the channels": func() redis.UniversalClient {
			if err := master.Client().Do(context.Background(), "ACL", "SETUSER", "nochannels", "on", ">pw-0123456789",
				"~ai:flight:*", "resetchannels", "+@all").Err(); err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: master.Addr, Username: "nochannels", Password: "pw-0123456789", MaxRetries: 1})
		},
		"cluster client, server no cluster": func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{master.Addr, master.Addr}, MaxRetries: 1})
		},
	}
	for name, client := range cases {
		t.Run(name, func(t *testing.T) {
			rdb := client()
			rec := newRecorder()
			g := New(Options{Redis: rdb, Observer: rec})
			var probes atomic.Int64
			g.hooks.probed = func() { probes.Add(1) }
			t.Cleanup(func() { g.Close(context.Background()); rdb.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := g.Check(ctx); err == nil || !g.Degraded() {
				t.Fatalf("Check: %v, degraded %v; want an error and the Group degraded", err, g.Degraded())
			}
			// The probe asks again every 250 ms: three rounds, and still degraded.
			waitCond(t, 5*time.Second, "three probes", func() bool { return probes.Load() >= 3 })
			if n := rec.count(EventRecovered); n != 0 || !g.Degraded() {
				t.Fatalf("%d recoveries, degraded %v; want none and degraded", n, g.Degraded())
			}
		})
	}
}

// In a Cluster the probe's write goes to one shard, the probe key's: that shard down
// degrades its own keys, not the whole instance.
func TestClusterProbeKeyShardDownDegradesOnlyItsShard(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, PartialCoverage: true})
	rdb := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil { // the layout is known before the kill
		t.Fatal(err)
	}
	dead, err := c.MasterOf("ai:flight:probe")
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(dead)
	g := New(Options{Redis: rdb})
	t.Cleanup(func() { g.Close(context.Background()) })
	if err := g.Check(ctx); err == nil {
		t.Fatal("Check: no error with the probe key's master down")
	}
	// A flight key on a master that runs.
	var key string
	for i := 0; key == ""; i++ {
		k := fmt.Sprintf("%064x", i)
		m, err := c.MasterOf(g.rem().keys(k).meta)
		if err != nil {
			t.Fatal(err)
		}
		if m != dead {
			key = k
		}
	}
	waitCond(t, 5*time.Second, "a key whose master runs is not local-only", func() bool { return !g.rem().degradedFor(key) })
}

// Redis stopped while a flight runs: the callers on every instance get an answer from a
// local call, the instances are degraded; once Redis answers again they recover, and the
// next flight is deduplicated across them again.
func TestFlightsGoLocalWhileRedisIsDownThenDedupeResumes(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	recA, recB := newRecorder(), newRecorder()
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond}
	oa, ob := o, o
	oa.Observer, ob.Observer = recA, recB
	a, bg := b.group(t, oa), b.group(t, ob)
	key := uniqueKey()
	rp := newReply("local")
	running := make(chan struct{}, 4)
	fn := started(running, rp.fn)
	waitA := doAll(t, a, key, 3, fn)
	<-running
	waitB := doAll(t, bg, key, 3, fn)
	recB.waitFor(t, EventRole, 1, 5*time.Second) // B follows
	srv.Stop()
	recB.waitFor(t, EventDegraded, 1, 10*time.Second)
	rp.release()
	for _, w := range []func() []outcome{waitA, waitB} {
		for _, o := range w() {
			if o.err != nil || o.body != "local" {
				t.Fatalf("with Redis down: got (%q, %v); want local", o.body, o.err)
			}
		}
	}
	if !bg.Degraded() {
		t.Fatalf("B not degraded with Redis down")
	}

	srv.Restart()
	recA.waitFor(t, EventRecovered, 1, 10*time.Second)
	recB.waitFor(t, EventRecovered, 1, 10*time.Second)
	rp2 := newReply("distributed")
	running2 := make(chan struct{}, 4)
	fn2 := started(running2, rp2.fn)
	key2 := uniqueKey()
	w2a := doAll(t, a, key2, 2, fn2)
	<-running2
	w2b := doAll(t, bg, key2, 2, fn2)
	recB.waitFor(t, EventRole, 2, 5*time.Second)
	rp2.release()
	for _, w := range []func() []outcome{w2a, w2b} {
		for _, o := range w() {
			if o.body != "distributed" {
				t.Fatalf("after recovery: got (%q, %v)", o.body, o.err)
			}
		}
	}
	if rp2.calls.Load() != 1 {
		t.Fatalf("after recovery %d calls; want 1 (distributed dedupe resumed)", rp2.calls.Load())
	}
}

// TestParkedFollowerInAClusterTakesOverWhenItsShardDies: in a Cluster the owner instance's
// alive messages go on while the master of one flight is dead (they speak for the whole
// instance, and it owns flights on other masters). A follower parked on that flight, on
// an instance with no command to send to that master, is answered within a few leases,
// not when the owner's hard timeout would end its trust.
func TestParkedFollowerInAClusterTakesOverWhenItsShardDies(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, PartialCoverage: true})
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond, TakeoverJitter: 20 * time.Millisecond}
	group := func(name string) *Group {
		oc := o
		oc.Redis = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClientName: name, ReadTimeout: time.Second,
			ContextTimeoutEnabled: true, MaxRetries: 1, DialerRetries: 1})
		g := New(oc)
		t.Cleanup(func() { g.Close(context.Background()); oc.Redis.Close() })
		<-g.Listening()
		return g
	}
	a, f := group("owner"), group("follower")
	masters, err := c.Masters()
	if err != nil {
		t.Fatal(err)
	}
	// The master of F's pub/sub connection stays up: F has nothing to send to the dead one.
	var subNode *redistest.Server
	for _, m := range masters {
		list, err := m.Client().ClientList(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, "name=follower") && strings.Contains(line, "cmd=subscribe") {
				subNode = m
			}
		}
	}
	if subNode == nil {
		for _, m := range masters {
			list, _ := m.Client().ClientList(context.Background()).Result()
			t.Log(list)
		}
		t.Fatal("F's pub/sub connection not found")
	}
	keyOn := func(pred func(*redistest.Server) bool) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("%064x", i)
			if m, err := c.MasterOf(a.rem().keys(k).meta); err == nil && pred(m) {
				return k
			}
		}
	}
	dead := masters[0]
	for _, m := range masters {
		if m != subNode {
			dead = m
		}
	}
	doomed := keyOn(func(m *redistest.Server) bool { return m == dead })
	other := keyOn(func(m *redistest.Server) bool { return m != dead })
	held := []*reply{newReply("doomed"), newReply("other")}
	defer held[0].release()
	defer held[1].release()
	for i, k := range []string{doomed, other} {
		r, err := a.Do(k, false, held[i].fn)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
	}
	waitCond(t, 10*time.Second, "owners running", func() bool { return a.Owned() == 2 })
	local := newReply("local")
	local.release()
	r := followEach(t, f, []string{doomed}, local.fn)[0]
	waitCond(t, 10*time.Second, "the follower's channel confirmed", func() bool {
		return f.rem().wake.UnconfirmedSince(f.rem().keys(doomed).stream).IsZero()
	})
	c.Kill(dead)
	if out := readWithin(r, 4*o.LeaseTTL+2*time.Second); out.err != nil || out.body != "local" {
		t.Fatalf("follower of the dead master's flight got (%q, %v, %v); want the local call's answer within a few leases", out.body, out.role, out.err)
	}
}

// TestTimeoutDegradesOnlyWhenRedisDoesNotAnswer: an operation that timed out waiting for a
// pooled connection of a busy process does not degrade the instance, since Redis answers a
// PING on a connection of its own; one that timed out on a Redis that hangs does, once.
func TestTimeoutDegradesOnlyWhenRedisDoesNotAnswer(t *testing.T) {
	srv := redistest.Start(t)
	const rt = 300 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: 500 * time.Millisecond, ReadTimeout: rt, WriteTimeout: rt,
		PoolSize: 2, MaxRetries: 2, DialerRetries: 1, ContextTimeoutEnabled: true, PoolTimeout: rt / 2})
	t.Cleanup(func() { c.Close() })
	rec := newRecorder()
	g := New(Options{Redis: c, RedisTimeout: rt, Observer: rec, TakeoverJitter: 20 * time.Millisecond})
	t.Cleanup(func() { g.Close(context.Background()) })
	<-g.Listening()
	confirmed := make(chan bool, 4)
	g.hooks.confirmed = func(answers bool) { confirmed <- answers }
	waitConfirmed := func(want bool) {
		t.Helper()
		select {
		case got := <-confirmed:
			if got != want {
				t.Fatalf("confirmation PING answered: %v; want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no timeout was confirmed")
		}
	}
	var held []*redis.Conn
	for range 2 { // every pooled connection taken: the process is busy, Redis is not
		cn := c.Conn()
		if err := cn.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		held = append(held, cn)
	}
	if out := readWithin(doInstant(t, g), 10*time.Second); out.err != nil || out.body != "ok" {
		t.Fatalf("with a busy pool: %q, %v", out.body, out.err)
	}
	waitConfirmed(true)
	if g.Degraded() || rec.count(EventShardDown) != 0 {
		t.Fatal("a busy pool degraded the instance")
	}
	for _, cn := range held {
		cn.Close()
	}

	srv.Pause() // Redis hangs: connections are accepted, nothing is answered
	defer srv.Resume()
	if out := readWithin(doInstant(t, g), 10*time.Second); out.err != nil || out.body != "ok" {
		t.Fatalf("with Redis hanging: %q, %v", out.body, out.err)
	}
	// A PING of the first half may still report; one answered after the pause cannot.
	for done := false; !done; {
		select {
		case answered := <-confirmed:
			done = !answered
		case <-time.After(10 * time.Second):
			t.Fatal("no timeout was confirmed while Redis hangs")
		}
	}
	if !g.Degraded() || rec.count(EventShardDown) != 1 {
		t.Fatalf("Redis hanging: degraded %v, %d shard-down events; want degraded, once", g.Degraded(), rec.count(EventShardDown))
	}
}

// doInstant starts a flight of a new key on g whose owner answers "ok" at once.
func doInstant(t *testing.T, g *Group) *Reader {
	t.Helper()
	r, err := g.Do(uniqueKey(), false, func(context.Context, *Writer) (Result, error) {
		return Result{Head: Head{Status: 200}, Body: []byte("ok"), Outcome: Store}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestFollowerTakesOverWhenItsInstanceFindsRedisHanging: a follower waits out its owner's
// lease when Redis refuses (a restart within it costs no call), but not once its instance
// has confirmed that Redis hangs: that says nothing of when it answers again.
func TestFollowerTakesOverWhenItsInstanceFindsRedisHanging(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 3 * time.Second, HeartbeatInterval: time.Second, RedisTimeout: 300 * time.Millisecond}
	a, f := b.group(t, o), b.group(t, o)
	rp := newReply("owner's")
	defer rp.release()
	keys, _ := ownEach(t, a, 1, func(int) Func { return rp.fn })
	local := newReply("local")
	local.release()
	r := followEach(t, f, keys, local.fn)[0]
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	f.rem().confirm(f.rem().keys(keys[0]).meta, context.DeadlineExceeded) // a timeout on F's path
	if out := readWithin(r, o.LeaseTTL/2); out.err != nil || out.body != "local" {
		t.Fatalf("follower got (%q, %v) after %v; want its own call's answer within half its owner's lease", out.body, out.err, time.Since(start))
	}
}

// TestSuspicionRedisAnswersCostsNoCall: an operation slower than half a deadline has its
// shard suspected until a PING on a connection of its own answers (ADR 0056). A slow link
// does that without Redis being out of reach: a flight started on that instance while the
// PING is out waits for its answer, then follows the flight another instance owns, instead
// of calling for itself (ADR 0062).
func TestSuspicionRedisAnswersCostsNoCall(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{LeaseTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond, RedisTimeout: time.Second}
	h := backend{redis: srv}.group(t, o) // the owner's instance
	g, link, confirmed := behindLink(t, srv, o)
	key := uniqueKey()
	release := make(chan struct{})
	var calls atomic.Int32
	fn := func(ctx context.Context, _ *Writer) (Result, error) {
		calls.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
		return Result{Head: Head{Status: 200}, Body: []byte("the owner's"), Outcome: Store}, nil
	}
	owner, err := h.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	waitCond(t, 5*time.Second, "the owner's claim", func() bool { return h.flightRole(key) == RoleOwner })

	// An operation was slow, Redis is not: the PING is answered, 300 ms on; then the link
	// is fast again.
	link.Set(faultproxy.Fault{Mode: faultproxy.Latency, Delay: 150 * time.Millisecond})
	g.rem().confirm(g.rem().keys(key).meta, errSlow)
	r, err := g.Do(key, false, fn) // while the PING is out
	if err != nil {
		t.Fatal(err)
	}
	select {
	case answers := <-confirmed:
		link.Set(faultproxy.Fault{})
		if !answers {
			t.Fatal("the confirmation PING was not answered; want a slow link, not a hang")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no confirmation PING ended within 5s")
	}
	waitCond(t, 5*time.Second, "a role on g", func() bool { return g.flightRole(key) != RoleUnknown })
	close(release)
	out := readWithin(r, 5*time.Second)
	if out.err != nil || out.body != "the owner's" || out.role != RoleFollower || calls.Load() != 1 || g.Degraded() {
		t.Fatalf("started while the PING was out: %q as %v (%v), %d calls, degraded %v; want the owner's answer as a follower, 1 call, not degraded",
			out.body, out.role, out.err, calls.Load(), g.Degraded())
	}
	if out := readWithin(owner, 5*time.Second); out.err != nil || out.body != "the owner's" {
		t.Fatalf("owner: %q, %v", out.body, out.err)
	}
}
