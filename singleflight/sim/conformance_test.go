package sim

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The stand-in is judged by a real redis-server: every script of the project and every
// command it sends, through every branch the steps below reach, gives the same replies and
// leaves the same data on both. Clocks differ by the time between a step on one server and
// on the other, so values that are times compare within the longest such gap measured so
// far, and 10 ms (a slack).

// script composes a project script as remote.go sends it: lookup and claim after wake.lua;
// the owner's writes after wake.lua and restore.lua; the others alone.
func script(t testing.TB, name string) *redis.Script {
	read := func(n string) string {
		b, err := os.ReadFile(filepath.Join("..", "lua", n+".lua"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	src := read(name)
	switch name {
	case "lookup", "claim":
		src = read("wake") + src
	case "renew", "append", "complete", "fail":
		src = read("wake") + read("restore") + src
	}
	return redis.NewScript(src)
}

// step is one command of a conformance case: a script with its keys and arguments, or a
// plain command; pause waits first (a lease to run out).
type step struct {
	script string
	keys   []string
	args   []any
	cmd    []any
	pause  time.Duration
}

func (s step) String() string {
	if s.script != "" {
		return fmt.Sprintf("%s %v %v", s.script, s.keys, s.args)
	}
	return fmt.Sprint(s.cmd...)
}

// restoreArgs are the six ARGV restore.lua reads last: owner, attempt, until (ms of Redis
// time, ” for none), batches, lease_ms, ttl_ms.
func restoreArgs(owner string, attempt int, until string, n int) []any {
	return []any{owner, attempt, until, n, 3000, 33000}
}

func keysOf(k string) (meta, stream, result string) {
	return "c:meta:{" + k + "}", "c:stream:{" + k + "}", "c:result:{" + k + "}"
}

// conformanceSteps walk every script through its branches, and the plain commands the
// project sends.
func conformanceSteps() []step {
	m1, s1, r1 := keysOf("k1")
	m2, s2, _ := keysOf("k2")
	m3, s3, r3 := keysOf("k3")
	m4, s4, _ := keysOf("k4")
	lookup := func(meta, result, stream string, noCache, cand, owner string, lease int, maxAge int, mark string, callers int) step {
		return step{script: "lookup", keys: []string{meta, result, stream},
			args: []any{noCache, cand, owner, lease, 33000, 30000, maxAge, "/v1/chat/completions", "m", mark, callers}}
	}
	claim := func(meta, stream, token, seen, state string, maxAttempts int, fresh string) step {
		return step{script: "claim", keys: []string{meta, stream},
			args: []any{token, seen, "B", 3000, 33000, maxAttempts, fresh, state, 30000, "/r", "m", "2", 2}}
	}
	appendStep := func(meta, stream, token string, n int, status, data string, maxLen int, until string) step {
		return step{script: "append", keys: []string{meta, stream},
			args: append([]any{token, n, status, `{"Content-Type":["text/event-stream"]}`, data, 33000, maxLen},
				restoreArgs("A", 1, until, n-1)...)}
	}
	renew := func(meta, stream, token, idle string, grace int) step {
		return step{script: "renew", keys: []string{meta, stream},
			args: append([]any{token, 3000, 33000, idle, grace, 1}, restoreArgs("A", 1, "", 0)...)}
	}
	complete := func(meta, stream, result, token string, landedN, skip int, store string) step {
		return step{script: "complete", keys: []string{meta, stream, result},
			args: append([]any{token, landedN, skip, 200, `{}`, "tail", "whole body", store, 600000, 30000},
				restoreArgs("A", 1, "", 2)...)}
	}
	fail := func(meta, stream, token, reason string) step {
		return step{script: "fail", keys: []string{meta, stream},
			args: append([]any{token, 500, `{}`, "oops", reason, 33000}, restoreArgs("A", 1, "", 0)...)}
	}
	unwait := func(meta, mark, finish string) step {
		return step{script: "unwait", keys: []string{meta}, args: []any{mark, finish}}
	}
	future := func() string { return "9999999999999" }
	return []step{
		{script: "incr", keys: []string{"c:owner-seq"}, args: []any{64, 604800000}},
		{script: "incr", keys: []string{"c:owner-seq"}, args: []any{64, 604800000}},
		// A new flight, claimed by its first lookup; the same lookup again; a follower's.
		lookup(m1, r1, s1, "0", "1-A-1", "A", 3000, 0, "", 0),
		lookup(m1, r1, s1, "0", "1-A-1", "A", 3000, 0, "", 0),
		lookup(m1, r1, s1, "0", "", "B", 3000, 0, "1", 2),
		claim(m1, s1, "2-B-1", "1-A-1", "R", 3, "0"),
		// The owner's batches: appended, again (safe twice), fenced, at the cap.
		appendStep(m1, s1, "1-A-1", 1, "200", "chunk one", 10000, ""),
		appendStep(m1, s1, "1-A-1", 1, "200", "chunk one", 10000, ""),
		appendStep(m1, s1, "2-B-1", 2, "", "not mine", 10000, ""),
		appendStep(m1, s1, "1-A-1", 2, "", strings.Repeat("x", 3000), 10000, ""),
		appendStep(m1, s1, "1-A-1", 3, "", "over", 3, ""),
		{cmd: []any{"XREAD", "COUNT", 100, "STREAMS", s1, "0"}},
		{cmd: []any{"HGETALL", m1}},
		// Renewals: plain, asked to cut while a follower's mark stands, after it left.
		renew(m1, s1, "1-A-1", "", 2000),
		renew(m1, s1, "1-A-1", "5000", 2000),
		renew(m1, s1, "2-B-1", "", 2000),
		unwait(m1, "B:1", "0"),
		unwait(m1, "B:1", "0"),
		renew(m1, s1, "1-A-1", "5000", 60000),
		{pause: 5 * time.Millisecond, script: "renew", keys: []string{m1, s1},
			args: append([]any{"1-A-1", 3000, 33000, "5000", 1, 1}, restoreArgs("A", 1, "", 0)...)},
		renew(m1, s1, "1-A-1", "", 2000),
		appendStep(m1, s1, "1-A-1", 4, "", "after the cut", 10000, ""),
		{cmd: []any{"HGETALL", m1}},
		complete(m1, s1, r1, "1-A-1", 0, 0, "0"), // its own cut flight: still its to end
		{cmd: []any{"HGETALL", m1}},
		// A cut flight is claimed at once; its answer is stored; then a hit, no-cache, max-age.
		lookup(m1, r1, s1, "0", "3-A-2", "A", 3000, 0, "", 0),
		appendStep(m1, s1, "3-A-2", 1, "200", "new chunk", 10000, ""),
		complete(m1, s1, r1, "3-A-2", 2, 3, "1"),
		complete(m1, s1, r1, "3-A-2", 2, 3, "1"),
		complete(m1, s1, r1, "2-B-1", 0, 0, "1"),
		{pause: 10 * time.Millisecond, script: "lookup", keys: []string{m1, r1, s1}, // a hit some ms old
			args: []any{"0", "", "B", 3000, 33000, 30000, 0, "/r", "m", "", 0}},
		lookup(m1, r1, s1, "1", "", "B", 3000, 0, "", 0),
		{pause: 5 * time.Millisecond, script: "lookup", keys: []string{m1, r1, s1},
			args: []any{"0", "", "B", 3000, 33000, 30000, 1, "/r", "m", "", 0}},
		{cmd: []any{"HGETALL", r1}},
		// Failures: failed, again, a claim after it, the attempts used up, a fresh start.
		lookup(m2, r1, s2, "0", "4-A-1", "A", 3000, 0, "", 0),
		fail(m2, s2, "4-A-1", "error"),
		fail(m2, s2, "4-A-1", "error"),
		lookup(m2, r1, s2, "0", "", "B", 3000, 0, "", 0),
		claim(m2, s2, "5-B-1", "4-A-1", "F", 3, "0"),
		claim(m2, s2, "5-B-1", "4-A-1", "F", 3, "0"),
		fail(m2, s2, "5-B-1", "shutdown"),
		claim(m2, s2, "6-B-1", "4-A-1", "F", 3, "0"),
		claim(m2, s2, "6-B-1", "5-B-1", "F", 1, "0"),
		claim(m2, s2, "6-B-1", "5-B-1", "F", 1, "1"),
		{cmd: []any{"HGETALL", m2}},
		// A lease that runs out, and its takeover.
		lookup(m3, r3, s3, "0", "7-A-1", "A", 1, 0, "", 0),
		{pause: 5 * time.Millisecond, script: "lookup", keys: []string{m3, r3, s3},
			args: []any{"0", "", "B", 3000, 33000, 30000, 0, "/r", "m", "2", 1}},
		claim(m3, s3, "8-B-1", "7-A-1", "R", 3, "0"), // takes its own mark, w:B:2, off
		{cmd: []any{"HGETALL", m3}},
		renew(m3, s3, "7-A-1", "", 2000),
		// A renewal that finds the lease shorter than its owner knows: Redis went back.
		{script: "renew", keys: []string{m3, s3},
			args: append([]any{"8-B-1", 3000, 33000, "", 2000, 1}, restoreArgs("B", 2, "9999999999999", 0)...)},
		{cmd: []any{"HGETALL", m3}},
		complete(m3, s3, r3, "8-B-1", 0, 0, "0"),
		lookup(m3, r3, s3, "0", "", "B", 3000, 0, "", 0),
		// A meta Redis lost: put back within the lease, not past it.
		lookup(m4, r1, s4, "0", "9-A-1", "A", 3000, 0, "", 0),
		{cmd: []any{"DEL", m4}},
		appendStep(m4, s4, "9-A-1", 1, "200", "restored", 10000, future()),
		{cmd: []any{"HGETALL", m4}},
		{cmd: []any{"DEL", m4}},
		appendStep(m4, s4, "9-A-1", 2, "", "too late", 10000, "1"),
		unwait(m4, "B:9", "1"),
		// The plain commands the project sends, and the other scripts.
		{script: "purge_ns", keys: []string{"c:ns:team"}, args: []any{600000}},
		{script: "purge_ns", keys: []string{"c:ns:team"}, args: []any{600000}},
		{script: "usable", keys: []string{"c:probe"}},
		{cmd: []any{"PTTL", s1}},
		{cmd: []any{"EXISTS", m1, m2, "c:nothing"}},
		{cmd: []any{"PUBLISH", "c:chan", "hello"}},
		{cmd: []any{"PING"}},
		{cmd: []any{"TIME"}},
		{cmd: []any{"SCRIPT", "LOAD", "return 1"}}, // Check loads the scripts so
		{cmd: []any{"SCAN", 0, "MATCH", "c:meta:*", "COUNT", 1000}},
		{cmd: []any{"DEL", r1}},
		{cmd: []any{"XREAD", "COUNT", 100, "STREAMS", s1, "0"}},
	}
}

// coveredCommands are the commands conformanceSteps send, scripts' own calls included:
// TestStandInCoversTheProjectsCommands holds what the project sends to this list.
var coveredCommands = []string{
	"CLIENT", "DEL", "EVAL", "EVALSHA", "EXISTS", "GET", "HDEL", "HELLO", "HGETALL", "HKEYS", "HMGET",
	"HSET", "INCRBY", "PEXPIRE", "PING", "PTTL", "PUBLISH", "SCAN", "SCRIPT", "SET", "TIME", "XADD", "XREAD",
	"SUBSCRIBE", "UNSUBSCRIBE", // TestStandInPublishesAsRedisDoes
}

func TestStandInAnswersAsRedisDoes(t *testing.T) {
	real := redistest.Start(t).Client()
	m := miniredis.RunT(t)
	m.ClockTTL(true) // as the simulator's nodes: TTLs run with the clock
	stand := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = stand.Close() })
	ctx := context.Background()
	var sl slack
	for i, s := range conformanceSteps() {
		time.Sleep(s.pause)
		start := time.Now()
		want, werr := run(ctx, t, real, s)
		got, gerr := run(ctx, t, stand, s)
		sl.widen(time.Since(start))
		if fmt.Sprint(werr) != fmt.Sprint(gerr) || !sl.alike(want, got) {
			t.Errorf("step %d, %s:\n got %v (%v)\nwant %v (%v) (times within %v)", i+1, s, show(got), gerr, show(want), werr, time.Duration(sl))
		}
	}
	if want, got := dump(ctx, t, real), dump(ctx, t, stand); !sl.alike(want, got) {
		t.Errorf("the data the steps left differ:\n got %v\nwant %v", show(got), show(want))
	}
}

// run sends a step as the project does: scripts through go-redis's Script (EVALSHA, then
// EVAL on NOSCRIPT), and the commands whose replies go-redis decodes through their typed
// methods, which read RESP2's and RESP3's shapes alike.
func run(ctx context.Context, t testing.TB, c *redis.Client, s step) (any, error) {
	if s.script != "" {
		v, err := script(t, s.script).Run(ctx, c, s.keys, s.args...).Result()
		return v, nilErr(err)
	}
	arg := func(i int) string { return fmt.Sprint(s.cmd[i]) }
	switch arg(0) {
	case "XREAD":
		v, err := c.XRead(ctx, &redis.XReadArgs{Streams: []string{arg(4), arg(5)}, Count: 100}).Result()
		var out []any
		for _, st := range v {
			out = append(out, st.Stream, entries(st.Messages))
		}
		return out, nilErr(err)
	case "HGETALL":
		v, err := c.HGetAll(ctx, arg(1)).Result()
		return v, nilErr(err)
	case "TIME":
		v, err := c.Time(ctx).Result()
		return strconv.FormatInt(v.UnixMicro(), 10), err
	case "SCAN":
		keys, cursor, err := c.Scan(ctx, 0, arg(3), 1000).Result()
		sort.Strings(keys)
		return fmt.Sprint(cursor, keys), nilErr(err)
	}
	v, err := c.Do(ctx, s.cmd...).Result()
	return v, nilErr(err)
}

func nilErr(err error) error {
	if err == redis.Nil {
		return nil
	}
	return err
}

// dump is every key a conformance step wrote: its type, whether it expires, and its data.
func dump(ctx context.Context, t testing.TB, c *redis.Client) any {
	keys, err := c.Keys(ctx, "c:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var out []any
	for _, k := range keys {
		typ := c.Type(ctx, k).Val()
		ttl := c.PTTL(ctx, k).Val()
		var data any
		switch typ {
		case "hash":
			h := c.HGetAll(ctx, k).Val()
			var fs []any
			for _, f := range sortedKeys(h) {
				fs = append(fs, f, h[f])
			}
			data = fs
		case "stream":
			data = entries(c.XRange(ctx, k, "-", "+").Val())
		case "string":
			data = c.Get(ctx, k).Val()
		}
		out = append(out, k, typ, ttl > 0, data)
	}
	return out
}

// entries are a stream's entries as IDs and sorted fields.
func entries(ms []redis.XMessage) []any {
	var es []any
	for _, e := range ms {
		var fs []any
		for _, f := range sortedKeys(e.Values) {
			fs = append(fs, f, fmt.Sprint(e.Values[f]))
		}
		es = append(es, e.ID, fs)
	}
	return es
}

var streamID = regexp.MustCompile(`^(\d{13})-(\d+)$`)

// slack is how far apart in time the two servers may have run a step: the longest gap
// between the two runs of one step so far, and 10 ms.
type slack time.Duration

func (s *slack) widen(gap time.Duration) { *s = max(*s, slack(gap+10*time.Millisecond)) }

// alike compares two replies: numbers and stream IDs within the slack when they look like
// times, everything else exactly.
func (s slack) alike(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !s.alike(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[any]any:
		y, ok := b.(map[any]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !s.alike(v, w) {
				return false
			}
		}
		return true
	case map[string]string:
		y, ok := b.(map[string]string)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !s.alike(v, w) {
				return false
			}
		}
		return true
	}
	sa, sb := fmt.Sprint(a), fmt.Sprint(b)
	if sa == sb {
		return true
	}
	if ma, mb := streamID.FindStringSubmatch(sa), streamID.FindStringSubmatch(sb); ma != nil && mb != nil {
		// Two entries in one ms on one server may fall in two on the other.
		sa, _ := strconv.Atoi(ma[2])
		sb, _ := strconv.Atoi(mb[2])
		return s.near(ma[1], mb[1]) && sa-sb <= 2 && sb-sa <= 2
	}
	return s.near(sa, sb)
}

// near reports whether two numbers are equal, or close enough where they may be times: a
// code or an attempt (below 5) must be equal; an age, what is left of a lease, a TTL or a
// time in ms may differ by less than the steps take, a time in µs likewise.
func (s slack) near(a, b string) bool {
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	var tol float64
	switch v := math.Abs(x); {
	case v < 5:
		tol = 0
	case v < 1e15: // ms
		tol = float64(time.Duration(s).Milliseconds())
	default: // µs
		tol = float64(time.Duration(s).Microseconds())
	}
	return math.Abs(x-y) <= tol
}

func show(v any) string {
	s := fmt.Sprintf("%q", v)
	if len(s) > 600 {
		s = s[:600] + "…"
	}
	return s
}

// TestStandInPublishesAsRedisDoes: a subscription's confirmations, and the message a script
// publishes with a stream entry (wake.lua), reach a go-redis PubSub alike from both.
func TestStandInPublishesAsRedisDoes(t *testing.T) {
	ctx := context.Background()
	hear := func(c *redis.Client) []any {
		m, s, r := keysOf("k9")
		ps := c.Subscribe(ctx, s, "c:alive:A")
		defer ps.Close()
		var got []any
		receive := func() {
			v, err := ps.ReceiveTimeout(ctx, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			switch x := v.(type) {
			case *redis.Subscription:
				got = append(got, x.Kind, x.Channel, int64(x.Count))
			case *redis.Message:
				got = append(got, "message", x.Channel, lengthPrefixed(x.Payload))
			}
		}
		receive()
		receive()
		if _, err := script(t, "lookup").Run(ctx, c, []string{m, r, s},
			"0", "1-A-1", "A", 3000, 33000, 30000, 0, "/r", "m", "", 0).Result(); err != nil {
			t.Fatal(err)
		}
		receive()
		if err := ps.Unsubscribe(ctx, s); err != nil {
			t.Fatal(err)
		}
		receive()
		if err := c.Publish(ctx, "c:alive:A", "~1-A-1").Err(); err != nil {
			t.Fatal(err)
		}
		receive()
		return got
	}
	real := redistest.Start(t).Client()
	m := miniredis.RunT(t)
	m.ClockTTL(true) // as the simulator's nodes: TTLs run with the clock
	stand := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = stand.Close() })
	var sl slack
	start := time.Now()
	want, got := hear(real), hear(stand)
	sl.widen(time.Since(start))
	if !sl.alike(want, got) {
		t.Errorf("what a subscriber heard:\n got %v\nwant %v", show(got), show(want))
	}
}

// lengthPrefixed splits a wake.lua message, "<len>:<bytes>" after "<len>:<bytes>"; a
// payload that is not one is returned whole.
func lengthPrefixed(p string) []any {
	var out []any
	for p != "" {
		n, rest, ok := strings.Cut(p, ":")
		l, err := strconv.Atoi(n)
		if !ok || err != nil || l > len(rest) {
			return []any{p}
		}
		out, p = append(out, rest[:l]), rest[l:]
	}
	return out
}

// TestStandInCoversTheProjectsCommands: every command the project's code and scripts make
// the stand-in run, in the stories and in explored seeds, is one the conformance steps
// check against a real server; every script the project sends is one of ../lua's.
func TestStandInCoversTheProjectsCommands(t *testing.T) {
	covered := map[string]bool{
		// The layout a Cluster client asks for: the stand-in answers CLUSTER SLOTS itself,
		// and COMMAND only tells go-redis where a command's keys are.
		"CLUSTER": true, "COMMAND": true,
	}
	for _, c := range coveredCommands {
		covered[c] = true
	}
	check := func(name string, w *world) {
		for _, n := range w.nodes {
			n.seen.Range(func(k, _ any) bool {
				if !covered[k.(string)] {
					t.Errorf("%s: the stand-in ran %s, which no conformance step checks", name, k)
				}
				return true
			})
		}
		for _, e := range w.hist.all() {
			if strings.Contains(e.what, "script ") {
				t.Errorf("%s: a script that is not one of ../lua: %s", name, e.what)
			}
		}
	}
	for _, s := range stories() {
		synctest.Test(t, func(t *testing.T) {
			s.cfg.verbose = func(string, string) bool { return true }
			w := newWorld(t, s.cfg)
			s.drive(w)
			w.run(s.settle)
			check(s.name, w)
		})
	}
	for seed := int64(1); seed <= 40; seed++ {
		synctest.Test(t, func(t *testing.T) {
			cfg, drive := scenario(seed)
			cfg.verbose = func(string, string) bool { return true }
			w := newWorld(t, cfg)
			drive(w)
			w.run(time.Second)
			check(fmt.Sprintf("seed %d", seed), w)
		})
	}
}

func TestAlike(t *testing.T) {
	for _, c := range []struct {
		a, b any
		want bool
	}{
		{"owner", "owner", true},
		{"owner", "follow", false},
		{int64(1), int64(0), false},                              // codes are exact
		{int64(64), int64(128), false},                           // counts are exact beyond a few
		{int64(3000), int64(2998), true},                         // what is left of a lease
		{"1796535958155", "1796535958156", true},                 // times in ms
		{"1796535958155", "1796535959155", false},                // a second apart
		{"1796535958155-0", "1796535958156-1", true},             // stream IDs
		{"1796535958155-0", "1796535958155-9", false},            // an entry's place
		{[]any{"a", int64(1)}, []any{"a", int64(1), "b"}, false}, // shape
		{map[string]string{"x": "1"}, map[string]string{"x": "2"}, false},
	} {
		if got := slack(50*time.Millisecond).alike(c.a, c.b); got != c.want {
			t.Errorf("alike(%v, %v) = %v; want %v", c.a, c.b, got, c.want)
		}
	}
}
