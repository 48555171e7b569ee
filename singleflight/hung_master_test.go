package singleflight

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/clusterclient"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Cluster master that hangs (SIGSTOP: connections accepted, nothing answered) costs
// only its own flights. See ADRs 0063, 0081.

// hungCluster is a Cluster of three masters, and Groups on it made as the proxy makes them.
type hungCluster struct {
	t  *testing.T
	c  *redistest.Cluster
	o  Options
	ms []*redistest.Server // the masters, asked once: a paused one cannot answer
}

func newHungCluster(t *testing.T, o Options) *hungCluster {
	return &hungCluster{t: t, c: redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Minute}), o: o}
}

// group is an instance with a Cluster client made as cmd/llm-dedupe-proxy's newRedis makes
// it; obs, if set, observes it.
func (h *hungCluster) group(name string, obs Observer) *Group {
	o := h.o
	o.Observer = obs
	rdb := clusterclient.New(&redis.ClusterOptions{Addrs: h.c.Addrs(), ClientName: name, ReadTimeout: o.RedisTimeout,
		WriteTimeout: o.RedisTimeout, ContextTimeoutEnabled: true, MaxRetries: 2, DialerRetries: 1})
	o.Redis = rdb
	g := New(o)
	h.t.Cleanup(func() { g.Close(context.Background()); rdb.Close() })
	return g
}

// keysOn returns n new keys whose flights live on master m.
func (h *hungCluster) keysOn(g *Group, m *redistest.Server, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("%s-%d", uniqueKey(), i)
		if got, err := h.c.MasterOf(g.rem().keys(k).meta); err == nil && got == m {
			keys = append(keys, k)
		}
	}
	return keys
}

func (h *hungCluster) masters() []*redistest.Server {
	if h.ms == nil {
		ms, err := h.c.Masters()
		if err != nil || len(ms) != 3 {
			h.t.Fatalf("masters: %v, %v", ms, err)
		}
		h.ms = ms
	}
	return slices.Clone(h.ms)
}

// own has g own keys, each held by rp until it is released, and waits until it does.
func own(t *testing.T, g *Group, keys []string, rp *reply) {
	t.Helper()
	for _, k := range keys {
		r, err := g.Do(k, false, rp.fn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
	}
	waitCond(t, 10*time.Second, "the keys owned", func() bool { return g.Owned() == len(keys) })
}

// TestHungMasterDelaysNoNewInstance: instances that start while a master, X, hangs, and
// have no Cluster layout yet, look up keys of the other masters, owned elsewhere, as soon
// as they start, after a Check as cmd/llm-dedupe-proxy makes (one in three) or without:
// each follows at once, whichever node it asks for the layout, and each key costs one
// upstream call. See ADR 0081.
func TestHungMasterDelaysNoNewInstance(t *testing.T) {
	o := Options{RedisTimeout: time.Second, LeaseTTL: 5 * time.Second, HeartbeatInterval: time.Second}
	h := newHungCluster(t, o)
	b := h.group("b", nil)
	ms := h.masters()
	// X holds no owner-seq: a new instance's first claim token would wait for it (ADR 0002).
	seq, err := h.c.MasterOf(b.rem().seqKey())
	if err != nil {
		t.Fatal(err)
	}
	ms = slices.DeleteFunc(ms, func(m *redistest.Server) bool { return m == seq })
	x, y := ms[0], ms[1]
	healthy := append(h.keysOn(b, y, 3), h.keysOn(b, seq, 3)...)
	held := newReply("b's answer")
	release := once(held.release)
	t.Cleanup(release)
	own(t, b, healthy, held)
	waitCond(t, 10*time.Second, "B's renewals landed", func() bool { return b.rem().renewer.round.Load() >= 2 })
	x.Pause()
	t.Cleanup(x.Resume)

	const fresh = 12 // each would ask X first for the layout, one in three, and for the command table
	type started struct {
		checked bool
		took    time.Duration // from the first request (after Check) to every flight placed
		roles   map[string]Role
	}
	done := make(chan started, fresh)
	ownCall := newReply("a new instance's own call")
	ownCall.release()
	for i := range fresh {
		go func() {
			rec := newRecorder()
			g := h.group(fmt.Sprintf("new-%d", i), rec)
			out := started{checked: i%3 == 0, roles: map[string]Role{}}
			if out.checked {
				ctx, cancel := context.WithTimeout(context.Background(), 2*o.RedisTimeout) // as wire.go
				_ = g.Check(ctx)
				cancel()
			}
			begun := time.Now()
			for _, k := range healthy {
				if r, err := g.Do(k, false, ownCall.fn); err == nil {
					t.Cleanup(func() { r.Close() })
				}
			}
			_ = condWithin(10*time.Second, "roles", func() bool {
				for _, e := range rec.eventsOf(EventRole) {
					out.roles[e.Key] = e.Role
				}
				return len(out.roles) == len(healthy)
			})
			out.took = time.Since(begun)
			done <- out
		}()
	}
	var slowest time.Duration
	defer func() { t.Logf("the slowest new instance placed its flights in %v", slowest) }()
	for range fresh {
		s := <-done
		slowest = max(slowest, s.took)
		for _, k := range healthy {
			if s.roles[k] != RoleFollower {
				t.Errorf("a new instance's flight of %s, a healthy master's key, is %v (checked: %v); want a follower of B's call", k, s.roles[k], s.checked)
			}
		}
		if s.took >= o.RedisTimeout/2 {
			t.Errorf("a new instance (checked: %v) placed its flights in %v; want within half a Redis timeout (%v): no wait for X", s.checked, s.took, o.RedisTimeout/2)
		}
	}
	release()
	if n := held.calls.Load() + ownCall.calls.Load(); n != int32(len(healthy)) {
		t.Errorf("%d upstream calls for %d healthy keys (%d of them new instances' own); want one each", n, len(healthy), ownCall.calls.Load())
	}
}

// roles waits for the role of a flight of each key, and returns them.
func roles(t *testing.T, rec *recorder, keys []string) map[string]Role {
	t.Helper()
	out := map[string]Role{}
	rec.waitMatch(t, "a role for each key", func(e Event) bool {
		if e.Kind == EventRole && slices.Contains(keys, e.Key) {
			out[e.Key] = e.Role
		}
		return len(out) == len(keys)
	}, 10*time.Second)
	return out
}

// TestHungMasterCostsNoOtherMastersLeases: A owns flights on every master when one, X,
// hangs: before A's first renewal (its renewal script is loaded nowhere yet), or once the
// renewals run. The leases of the other masters' flights are renewed on time round after
// round: B, asking for them leases later, follows A's calls, and each key costs one
// upstream call.
func TestHungMasterCostsNoOtherMastersLeases(t *testing.T) {
	for _, renewing := range []bool{false, true} {
		t.Run(fmt.Sprintf("renewing=%v", renewing), func(t *testing.T) { hungMasterLeases(t, renewing) })
	}
}

func hungMasterLeases(t *testing.T, renewing bool) {
	o := Options{RedisTimeout: time.Second, LeaseTTL: 3 * time.Second, HeartbeatInterval: time.Second}
	h := newHungCluster(t, o)
	rec, recB := newRecorder(), newRecorder()
	a, b := h.group("a", rec), h.group("b", recB)
	ms := h.masters()
	x := ms[0]
	healthy := append(h.keysOn(a, ms[1], 4), h.keysOn(a, ms[2], 4)...)
	a.rem().newToken(context.Background()) // each instance's block of owner-seq numbers is reserved
	b.rem().newToken(context.Background())

	held := newReply("a's answer")
	release := once(held.release)
	t.Cleanup(release)
	own(t, a, append(slices.Clone(healthy), h.keysOn(a, x, 1)...), held)
	if renewing {
		waitCond(t, 10*time.Second, "renewals landed", func() bool { return a.rem().renewer.round.Load() >= 2 })
	} else if n := a.rem().renewer.round.Load(); n != 0 {
		t.Fatalf("%d renewal rounds before the hang; want none: the first one loads the script", n)
	}
	x.Pause()
	t.Cleanup(x.Resume)

	rounds := a.rem().renewer.round.Load() + int64(2*o.LeaseTTL/o.HeartbeatInterval) + 1
	waitCond(t, 20*time.Second, "two leases of renewal rounds", func() bool { return a.rem().renewer.round.Load() >= rounds })
	other := newReply("b's own call")
	other.release()
	var readers []*Reader
	for _, k := range healthy {
		r, err := b.Do(k, false, other.fn)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	for k, role := range roles(t, recB, healthy) {
		if role != RoleFollower {
			t.Errorf("B's flight of %s, a healthy master's key, is %v two leases into X's hang; want a follower of A's call", k, role)
		}
	}
	failed := rec.countWhere(func(e Event) bool { return e.Kind == EventHeartbeatFailed && slices.Contains(healthy, e.Key) })
	t.Logf("healthy renewals failed while X hung: %d", failed)
	if failed > 0 {
		t.Errorf("%d renewals of healthy masters' flights failed while X hung; want none", failed)
	}
	release()
	for _, r := range readers {
		if got := readWithin(r, 10*time.Second); got.err != nil || got.body != "a's answer" {
			t.Errorf("a caller of a healthy key on B got (%q, %v, %v); want A's answer", got.body, got.role, got.err)
		}
	}
	if n := held.calls.Load() + other.calls.Load(); n != int32(len(healthy))+1 {
		t.Fatalf("%d upstream calls for %d healthy keys and X's one; want one each", n, len(healthy))
	}
}

// subscribedOn returns the master that holds the pub/sub connection of the instance whose
// client is named name, nil if none that answers does.
func (h *hungCluster) subscribedOn(name string) *redistest.Server {
	for _, m := range h.masters() {
		c := redis.NewClient(&redis.Options{Addr: m.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
		list, err := c.ClientList(context.Background()).Result()
		c.Close()
		if err != nil {
			continue // the hung master
		}
		for _, line := range strings.Split(list, "\n") {
			f := map[string]string{}
			for _, kv := range strings.Fields(line) {
				k, v, _ := strings.Cut(kv, "=")
				f[k] = v
			}
			// A subscriber: its last command may be a subscribe, or the hub's PING.
			if f["name"] == name && (strings.Contains(f["flags"], "P") || f["cmd"] == "subscribe") {
				return m
			}
		}
	}
	return nil
}

// TestHungMasterUnderTheHubWakesFollowers: B's pub/sub connection is on master X; B
// follows flights of the other masters, owned by A, and nothing else B does touches X.
// X hangs, then A answers: B's callers get the answer within seconds, the connection
// having left X, not at their lease's end. See ADR 0081.
func TestHungMasterUnderTheHubWakesFollowers(t *testing.T) {
	o := Options{RedisTimeout: time.Second, LeaseTTL: 12 * time.Second, HeartbeatInterval: time.Second}
	h := newHungCluster(t, o)
	a, b := h.group("a", nil), h.group("b", nil)
	<-b.Listening()
	x := h.subscribedOn("b")
	if x == nil {
		t.Fatal("B's pub/sub connection is on no master")
	}
	var keys []string
	for _, m := range h.masters() {
		if m != x {
			keys = append(keys, h.keysOn(a, m, 2)...)
		}
	}
	a.rem().newToken(context.Background()) // each instance's block of owner-seq numbers is reserved
	b.rem().newToken(context.Background())
	held := newReply("a's answer")
	release := once(held.release)
	t.Cleanup(release)
	own(t, a, keys, held)
	other := newReply("b's own call")
	other.release()
	readers := followEach(t, b, keys, other.fn)
	waitCond(t, 10*time.Second, "B's subscriptions confirmed", func() bool {
		for _, k := range keys {
			if !b.rem().wake.UnconfirmedSince(b.rem().keys(k).stream).IsZero() {
				return false
			}
		}
		return true
	})
	x.Pause()
	t.Cleanup(x.Resume)

	released := time.Now()
	release()
	for _, r := range readers {
		if got := readWithin(r, 2*o.LeaseTTL); got.err != nil || got.body != "a's answer" {
			t.Fatalf("a caller on B got (%q, %v, %v); want A's answer", got.body, got.role, got.err)
		}
	}
	took := time.Since(released)
	t.Logf("B's callers answered %v after A's answer landed", took)
	if took >= o.LeaseTTL/2 {
		t.Errorf("B's callers got A's answer %v after it landed; want within half a lease (%v): B's pub/sub connection leaves X", took, o.LeaseTTL/2)
	}
	waitCond(t, 5*time.Second, "B's pub/sub connection on a master that answers", func() bool {
		m := h.subscribedOn("b") // nil while it moves, or before it subscribes again
		return m != nil && m != x
	})
	if n := held.calls.Load() + other.calls.Load(); n != int32(len(keys)) {
		t.Errorf("%d upstream calls for %d keys; want one each", n, len(keys))
	}
}
