package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// load sends requests from workers spread over the instances until stopped (or a bound is
// reached), and keeps every answer.
type load struct {
	mu      sync.Mutex
	answers []answer
	changed chan struct{} // closed and replaced on every answer
	stop    chan struct{}
	wg      sync.WaitGroup
}

// startLoad runs workers that each send round after round of the same requests: workers
// with the same round number at the same time share a flight, across instances.
func startLoad(ins []*instance, workers, maxRounds int, model string) *load {
	l := &load{changed: make(chan struct{}), stop: make(chan struct{})}
	for w := range workers {
		in := ins[w%len(ins)]
		l.wg.Go(func() {
			for r := range maxRounds {
				select {
				case <-l.stop:
					return
				default:
				}
				a := post(in.URL, chatPath, chatBody(model, fmt.Sprintf("round %d", r)), apiKeyA)
				l.mu.Lock()
				l.answers = append(l.answers, a)
				close(l.changed)
				l.changed = make(chan struct{})
				l.mu.Unlock()
			}
		})
	}
	return l
}

// waitAnswers waits until n more answers than after have arrived; it returns their count.
func (l *load) waitAnswers(t testing.TB, after, n int) int {
	t.Helper()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		l.mu.Lock()
		got, ch := len(l.answers), l.changed
		l.mu.Unlock()
		if got >= after+n {
			return got
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("load: %d answers in 20s; want %d", got-after, n)
		}
	}
}

func (l *load) finish() []answer {
	close(l.stop)
	l.wg.Wait()
	return l.answers
}

// TestRedisStoppedMidRun: Redis dies while requests flow and comes back later. No client
// request fails: the instances fall back to local-only dedupe (degraded in /readyz), and
// return to distributed dedupe by themselves when Redis answers again.
func TestRedisStoppedMidRun(t *testing.T) {
	c := startCluster(t, clusterOpts{env: map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "0s"}}) // dedupe only: every round is a flight
	c.fake.set(fakeupstream.Behavior{Delay: 30 * time.Millisecond})
	model := "e2e-redis-down"
	l := startLoad(c.ins, 9, 300, model)
	n := l.waitAnswers(t, 0, 30)

	c.redis.Stop()
	down := time.Now()
	for _, in := range c.ins {
		in.waitDegraded(true, 10*time.Second)
	}
	n = l.waitAnswers(t, n, 30) // served while Redis is down
	c.redis.Restart()
	up := time.Now()
	for _, in := range c.ins {
		in.waitDegraded(false, 10*time.Second)
	}
	recovered := time.Since(up)
	l.waitAnswers(t, n, 30)
	as := l.finish()
	slowest := time.Duration(0)
	for i, a := range as {
		wantChat(t, fmt.Sprintf("request %d", i), a, model, 0)
		slowest = max(slowest, a.took)
	}
	t.Logf("REDIS outage=%dms recovered_after_restart=%dms requests=%d slowest=%dms", ms(up.Sub(down)), ms(recovered), len(as), ms(slowest))
	// A dead Redis is noticed fast, not by requests waiting on it (the server refuses
	// connections at once). The one wait allowed is a follower's whose owner elsewhere
	// holds a lease it knows of: it waits, at most until that lease ends, for Redis to come
	// back (see ADR 0023). So no request waits longer than a lease and
	// half a second, a fifteenth of which is the upstream's own time.
	if limit := leaseTTL + 500*time.Millisecond; slowest > limit {
		t.Errorf("the slowest request took %v while Redis was down; want at most %v", slowest.Round(time.Millisecond), limit)
	}
	for _, in := range c.ins {
		if got := in.metric("llm_dedupe_redis_errors_total", nil); got < 1 {
			t.Errorf("%s: redis_errors_total %v; want the outage counted", in.name, got)
		}
		if got := in.metric("llm_dedupe_backend_degraded", nil); got != 0 {
			t.Errorf("%s: backend_degraded %v after recovery; want 0", in.name, got)
		}
	}

	// Distributed dedupe is back: a burst over the three instances costs one call.
	before := c.fake.stats().Calls
	c.fake.set(fakeupstream.Behavior{Hold: true})
	body := chatBody(model, "after the outage")
	chs := spread(c.ins, 30, chatPath, body, apiKeyA)
	waitWaiting(t, c.ins, 30)
	c.fake.release()
	first := int64(0)
	for i, a := range collect(chs) {
		got := wantChat(t, fmt.Sprintf("burst %d", i), a, model, first)
		if first == 0 {
			first = got
		}
	}
	if calls := c.fake.stats().Calls - before; calls != 1 {
		t.Errorf("burst after recovery: %d upstream calls; want 1", calls)
	}
}

// TestRedisRestartMidFlight: Redis is restarted (SIGKILL, then started on the same port)
// while a unary and a streamed flight wait for the upstream, with and without persistence.
// No client gets a wrong or mixed answer or hangs; without persistence the owner puts its
// lost flights back with its next renewal while its lease runs, and nothing is called twice.
func TestRedisRestartMidFlight(t *testing.T) {
	for _, tc := range []struct{ persist, late bool }{{false, false}, {true, false}, {false, true}} {
		t.Run(fmt.Sprintf("persist=%v/late=%v", tc.persist, tc.late), func(t *testing.T) {
			testRedisRestartMidFlight(t, tc.persist, tc.late)
		})
	}
}

// testRedisRestartMidFlight restarts Redis while flights wait; late, only after the
// followers have waited two leases, the owner's alive messages alone keeping them waiting.
func testRedisRestartMidFlight(t *testing.T, persist, late bool) {
	o := clusterOpts{persist: persist}
	if !late {
		// A restart well within the owner's lease, however slow the machine: the flights
		// then survive it, and that is asserted, not assumed.
		o.env = map[string]string{"LLM_DEDUPE_FLIGHT_LEASE_TTL": restartLease.String()}
	}
	c := startCluster(t, o)
	const chunks = 5
	c.fake.set(fakeupstream.Behavior{Hold: true, Chunks: chunks})
	model := fmt.Sprintf("e2e-redis-restart-%v-%v", persist, late)
	unary, stream := chatBody(model, "unary through a restart"), streamBody(model, "stream through a restart")

	// Both flights are owned by the first instance, followed by the others.
	owner := []<-chan answer{postAsync(c.ins[0].URL, chatPath, unary, apiKeyA)}
	streams := []*sseClient{openSSE(c.ins[0].URL, stream, apiKeyA)}
	c.fake.waitFor(fakeupstream.Stats{Calls: 2}, 10*time.Second)
	streams[0].waitEvents(t, "stream owner", 1)
	chs := append(owner, spread(c.ins, 11, chatPath, unary, apiKeyA)...)
	for i := range 8 {
		streams = append(streams, openSSE(c.ins[i%3].URL, stream, apiKeyA))
	}
	for i, s := range streams {
		s.waitEvents(t, fmt.Sprintf("stream %d", i), 1)
	}
	waitWaiting(t, c.ins, len(chs)) // streams that have their first chunk no longer wait

	if late {
		time.Sleep(2 * leaseTTL) // the time itself is the condition: past the lookups' leases
	}
	rdb := c.redis.Client()
	metas := func() int {
		keys, _ := rdb.Keys(context.Background(), "ai:flight:meta:*").Result()
		return len(keys)
	}
	if n := metas(); n != 2 {
		t.Fatalf("%d flights in Redis before the restart; want 2", n)
	}
	c.redis.Stop()
	if late {
		// An outage the followers see: their instances find Redis down first.
		c.ins[1].waitDegraded(true, 10*time.Second)
		c.ins[2].waitDegraded(true, 10*time.Second)
	}
	c.redis.Restart()
	restarted := time.Now()
	kept := metas()
	if persist && kept != 2 {
		// (Without persistence the restart empties Redis, but an owner's renewal, tried
		// again all through the outage, may have put its flight back already.)
		t.Errorf("%d flights in Redis after the restart; want 2", kept)
	}
	restored := kept
	if !persist {
		// The owner's next renewal finds its flights gone: while its lease runs by Redis's
		// clock, it puts them back (restore.lua) and its calls go on. A restart slower
		// than the lease ends the lease instead: the calls are cancelled and new flights
		// call again, as for a lost owner.
		deadline := time.Now().Add(10 * time.Second)
		for restored = metas(); restored < 2 && time.Now().Before(deadline); restored = metas() {
			time.Sleep(20 * time.Millisecond) // no event says a script ran
		}
	}
	if !late && restored != 2 {
		t.Errorf("%d flights in Redis %v after a restart within the lease (%v); want both put back", restored, time.Since(restarted).Round(time.Millisecond), restartLease)
	}
	for _, in := range c.ins {
		in.waitDegraded(false, 10*time.Second)
	}
	c.fake.release()

	calls := map[int64]bool{}
	for i, a := range collect(chs) {
		calls[wantChat(t, fmt.Sprintf("unary client %d", i), a, model, 0)] = true
	}
	interrupted := 0
	for i, s := range streams {
		n, broken := checkStream(t, fmt.Sprintf("stream client %d", i), s.result(), model, chunks)
		calls[n] = true
		if broken {
			interrupted++
		}
	}
	s := c.fake.stats()
	t.Logf("REDIS restart persist=%v late=%v: flights kept %d, restored %d; answered %v after the restart; upstream %+v; answers from calls %v; streams interrupted %d of %d",
		persist, late, kept, restored, time.Since(restarted).Round(time.Millisecond), s, keys(calls), interrupted, len(streams))
	// Late, the followers' instances degraded first: whether the outage outlasted the
	// lease is the machine's doing, so both endings are allowed there, and only the bound
	// below holds. Otherwise the flights survived, as asserted above.
	if !late && (s.Calls != 2 || s.Abandoned != 0 || interrupted != 0) {
		t.Errorf("both flights survived the restart, yet %d calls, %d abandoned, %d streams interrupted; want 2, 0, 0",
			s.Calls, s.Abandoned, interrupted)
	}
	// At most: the two original calls, then one per instance and flight.
	if s.Calls > 2+2*int64(len(c.ins)) {
		t.Errorf("%d upstream calls; want at most %d", s.Calls, 2+2*len(c.ins))
	}

	// Dedupe works on the restarted Redis: a burst costs one call.
	before := s.Calls
	c.fake.set(fakeupstream.Behavior{Hold: true})
	burst := spread(c.ins, 30, chatPath, chatBody(model, "after the restart"), apiKeyA)
	waitWaiting(t, c.ins, 30)
	c.fake.release()
	for i, a := range collect(burst) {
		wantChat(t, fmt.Sprintf("burst %d", i), a, model, before+1)
	}
}

// restartLease is the lease of a Redis restart that must not outlast it.
const restartLease = 5 * time.Second

func keys(m map[int64]bool) []int64 {
	var out []int64
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestShortRedisRestartCostsNoCall: Redis, with its append-only file, restarts while a
// unary call is owned by one instance and followed on the others. The followers keep
// reading while the owner's lease, as they last knew it, runs: an outage shorter than that
// costs no call of their own (each instance used to call the upstream itself at Redis's
// first refusal, however short the outage).
func TestShortRedisRestartCostsNoCall(t *testing.T) {
	c := startCluster(t, clusterOpts{persist: true, env: map[string]string{
		"LLM_DEDUPE_FLIGHT_LEASE_TTL": "3s", "LLM_DEDUPE_FLIGHT_HEARTBEAT_INTERVAL": "1s",
	}})
	c.fake.set(fakeupstream.Behavior{Hold: true})
	const model = "e2e-short-restart"
	body := chatBody(model, "through a short Redis restart")
	chs := []<-chan answer{postAsync(c.ins[0].URL, chatPath, body, apiKeyA)}
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	chs = append(chs, spread(c.ins, 6, chatPath, body, apiKeyA)...)
	waitWaiting(t, c.ins, len(chs))
	redistest.WaitUntil(t, 10*time.Second, "the other instances follow", func() (bool, string) {
		n := sum(c.ins, "llm_dedupe_flight_roles_total", map[string]string{"role": "follower"})
		return n >= 2, fmt.Sprintf("%v flights follow", n)
	})
	c.redis.Stop()
	time.Sleep(600 * time.Millisecond) // the outage, within the lease
	c.redis.Restart()
	for _, in := range c.ins {
		in.waitDegraded(false, 10*time.Second)
	}
	c.fake.release()
	for i, a := range collect(chs) {
		wantChat(t, fmt.Sprintf("client %d", i), a, model, 1)
	}
	if s := c.fake.stats(); s.Calls != 1 || s.Abandoned != 0 {
		t.Fatalf("upstream %+v; want the owner's call alone", s)
	}
}
