package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestClusterFailover measures what losing one master of a real Redis Cluster costs: three
// proxies share a 3-master cluster with a replica per master (cluster-node-timeout 1s).
// Six prompts, two whose keys live on each master, are sent round after round, each to
// all three instances at once; with result_ttl 0 every round is a new flight of each
// prompt, which costs one upstream call when the instances deduplicate. One master (not the
// one holding the token counter) is killed with kill -9 mid-run; traffic goes on until its
// replica has been promoted and for a while after. Each round's upstream calls are held
// until every one of its requests is in a flight, so that they overlap. The upstream calls
// beyond one per prompt and round are counted, split by whether the prompt's key lives on the killed
// shard or a healthy one, and logged with how long the instances were degraded:
//
//	go test -count=1 -run TestClusterFailover -v ./e2e/ | grep CLUSTER-FAILOVER
//
// E2E_FAILOVER_AFTER (a duration, 3s if unset) sets how long traffic goes on after the
// promotion.
//
// It runs with Redis's default cluster-require-full-coverage yes, under which every node
// refuses every key from the moment the master is marked failed until its replica is
// promoted, and with it set to no. Both assert that every client gets a whole answer of an
// upstream call made for its own prompt, none hangs, and no round before the kill makes an
// extra call; with partial coverage, also that flights on the healthy shards keep their
// distributed dedupe: no extra call.
func TestClusterFailover(t *testing.T) {
	for _, partial := range []bool{false, true} {
		t.Run(fmt.Sprintf("partial_coverage=%v", partial), func(t *testing.T) { testClusterFailover(t, partial) })
	}
}

func testClusterFailover(t *testing.T, partial bool) {
	const (
		perShard = 2           // prompts whose keys live on each master
		prefix   = "ai:flight" // redis.key_prefix's default
	)
	after := 3 * time.Second // of traffic after the promotion; longer by hand, to look further
	if v := os.Getenv("E2E_FAILOVER_AFTER"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("E2E_FAILOVER_AFTER: %v", err)
		}
		after = d
	}
	rc := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second, PartialCoverage: partial})
	c := startCluster(t, clusterOpts{redisAddrs: rc.Addrs(), env: map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "0s"}})
	model := "e2e-cluster-failover"

	// The victim is a master that does not hold the token counter: losing that one would
	// stop new flights everywhere, which is a different measurement.
	masters, err := rc.Masters()
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters %v, %v; want 3", masters, err)
	}
	seq, err := rc.MasterOf(prefix + ":owner-seq")
	if err != nil {
		t.Fatal(err)
	}
	var victim *redistest.Server
	for _, m := range masters {
		if m != seq {
			victim = m
			break
		}
	}

	// Prompts, two per master, by the slot of their key's hash tag.
	h := hashing.New(hashing.Options{IgnoreFields: []string{"user"}}) // the default scope: credential
	hdr := http.Header{"Authorization": {"Bearer " + apiKeyA}}
	type prompt struct {
		body, key string
		shard     *redistest.Server
	}
	var prompts []prompt
	per := map[*redistest.Server]int{}
	for i := 0; len(prompts) < perShard*len(masters); i++ {
		body := chatBody(model, fmt.Sprintf("prompt %d", i))
		req, err := h.Key(http.MethodPost, chatPath, hdr, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		m, err := rc.MasterOf(prefix + ":meta:{" + req.Key + "}")
		if err != nil {
			t.Fatal(err)
		}
		if per[m] < perShard {
			per[m]++
			prompts = append(prompts, prompt{body: body, key: req.Key, shard: m})
		}
	}
	onVictim := func(p int) bool { return prompts[p].shard == victim }

	// One round: every prompt to every instance at once; extra[p] is the calls for p
	// beyond one, from the fake's log of the calls made during the round.
	var (
		seen       int // calls of the fake's log already attributed
		maxLatency time.Duration
	)
	type round struct {
		at    time.Time
		extra []int
	}
	runRound := func() round {
		t.Helper()
		r := round{at: time.Now(), extra: make([]int, len(prompts))}
		// The round's calls are held until each of its requests has joined a flight or
		// made a call: the requests of a round overlap, so an extra call is dedupe lost,
		// never a request that came after its prompt's call had ended.
		c.fake.set(fakeupstream.Behavior{Hold: true})
		decided := sum(c.ins, "llm_dedupe_flight_roles_total", nil)
		chs := make([][]<-chan answer, len(prompts))
		for p := range prompts {
			for _, in := range c.ins {
				chs[p] = append(chs[p], postAsync(in.URL, chatPath, prompts[p].body, apiKeyA))
			}
		}
		n := len(prompts) * len(c.ins) // one local flight each: every instance gets each prompt once
		redistest.WaitUntil(t, 20*time.Second, "every request of the round in a flight", func() (bool, string) {
			got := sum(c.ins, "llm_dedupe_flight_roles_total", nil) - decided
			return int(got) >= n, fmt.Sprintf("%v of %d with a role", got, n)
		})
		c.fake.release()
		answers := make([][]answer, len(prompts))
		for p := range prompts {
			answers[p] = collect(chs[p])
		}
		calls := c.fake.calls()
		byN := map[int64]string{}
		for _, call := range calls {
			byN[call.N] = call.Body
		}
		for p := range prompts {
			for i, a := range answers[p] {
				who := fmt.Sprintf("prompt %d on %s", p, c.ins[i].name)
				maxLatency = max(maxLatency, a.took)
				n := wantChat(t, who, a, model, 0)
				if n != 0 && byN[n] != prompts[p].body {
					t.Errorf("%s: the answer of call %d, made for %q; want one made for %q", who, n, byN[n], prompts[p].body)
				}
				if k := a.header.Get("X-Dedupe-Key"); a.err == nil && k != prompts[p].key {
					t.Errorf("%s: X-Dedupe-Key %s; want %s, the key its shard was chosen by", who, k, prompts[p].key)
				}
			}
			r.extra[p] = -1
		}
		for _, call := range calls[seen:] {
			for p := range prompts {
				if call.Body == prompts[p].body {
					r.extra[p]++
				}
			}
		}
		seen = len(calls)
		return r
	}

	for range 3 { // distributed dedupe before the fault: one call per prompt and round
		if r := runRound(); sumInts(r.extra) != 0 {
			t.Errorf("before the kill: extra calls %v in a round; want none", r.extra)
		}
	}

	// Watch the failover from the cluster's side while traffic goes on.
	var victimKey string
	for p := range prompts {
		if onVictim(p) {
			victimKey = prefix + ":meta:{" + prompts[p].key + "}"
			break
		}
	}
	var (
		mu       sync.Mutex
		promoted time.Time
		newer    *redistest.Server
	)
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	killed := time.Now()
	rc.Kill(victim)
	go func() {
		defer close(watched)
		for {
			if m, err := rc.Served(victimKey); err == nil && m != victim {
				mu.Lock()
				promoted, newer = time.Now(), m
				mu.Unlock()
				return
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(20 * time.Millisecond): // polling: the cluster announces no event
			}
		}
	}()
	var rounds []round
	deadline := killed.Add(20*time.Second + after)
	for {
		r := runRound()
		rounds = append(rounds, r)
		mu.Lock()
		p := promoted
		mu.Unlock()
		if (!p.IsZero() && time.Since(p) >= after) || time.Now().After(deadline) {
			break
		}
	}
	close(stopWatch)
	<-watched
	end := time.Now()
	if promoted.IsZero() {
		t.Fatalf("the killed master's slots were not served by its replica within %v", deadline.Sub(killed))
	}

	// The figures.
	var healthyExtra, failedExtra, duringExtra int
	for _, r := range rounds {
		var healthy, failed int
		for p, e := range r.extra {
			if onVictim(p) {
				failed += e
			} else {
				healthy += e
			}
		}
		healthyExtra, failedExtra = healthyExtra+healthy, failedExtra+failed
		if r.at.Before(promoted) {
			duringExtra += healthy + failed
		}
		t.Logf("round at %+5dms after the kill: extra calls %d on healthy shards, %d on the failed one", ms(r.at.Sub(killed)), healthy, failed)
	}
	var degraded []string
	var episodes int
	for _, in := range c.ins {
		d, n := degradedTime(in, killed, end)
		degraded = append(degraded, fmt.Sprint(ms(d)))
		episodes += n
	}
	t.Logf("CLUSTER-FAILOVER partial_coverage=%v prompts=%d rounds=%d extra_calls=%d healthy_shard_extra=%d failed_shard_extra=%d extra_before_promotion=%d failover_ms=%d after_ms=%d degraded_ms=%s degraded_episodes=%d max_latency_ms=%d",
		partial, len(prompts), len(rounds), healthyExtra+failedExtra, healthyExtra, failedExtra, duringExtra,
		ms(promoted.Sub(killed)), ms(end.Sub(promoted)), strings.Join(degraded, ","), episodes, ms(maxLatency))
	t.Logf("killed master %s (its replica %s took over); token counter on %s", victim.Addr, newer.Addr, seq.Addr)

	if maxLatency > 10*time.Second {
		t.Errorf("a request took %v: a failover must not hang clients", maxLatency)
	}
	// A failing shard sends only its own keys local-only. (With full coverage required,
	// every shard refuses every key for a moment, and healthy ones pay too.)
	if partial && healthyExtra != 0 {
		t.Errorf("%d upstream calls beyond one per prompt and round on healthy shards; want 0", healthyExtra)
	}
}

func sumInts(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// degradedTime is how long, between from and to, the instance's log says it served some
// keys with local-only dedupe (all of Redis, or one Cluster shard: the time of each shard
// counts), and how many times a shard entered that state.
func degradedTime(in *instance, from, to time.Time) (time.Duration, int) {
	in.mu.Lock()
	lines := append([]string(nil), in.lines...)
	in.mu.Unlock()
	var (
		total time.Duration
		since = map[string]time.Time{} // shard ("" = all of Redis) → degraded since
		n     int
	)
	end := func(shard string, at time.Time) {
		if s, ok := since[shard]; ok {
			total += at.Sub(s)
			delete(since, shard)
		}
	}
	for _, l := range lines {
		m := parseLog(l)
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["time"]))
		if m == nil || err != nil || at.Before(from) {
			continue
		}
		shard, _ := m["shard"].(string)
		switch msg, _ := m["msg"].(string); {
		case strings.HasPrefix(msg, "redis unavailable"), strings.HasPrefix(msg, "redis cluster shard unavailable"):
			if _, ok := since[shard]; !ok {
				since[shard], n = at, n+1
			}
		case strings.HasPrefix(msg, "redis cluster shard usable again"):
			end(shard, at)
		case strings.HasPrefix(msg, "redis answers again"):
			for s := range since {
				end(s, at)
			}
		}
	}
	for s := range since {
		end(s, to)
	}
	return total, n
}
