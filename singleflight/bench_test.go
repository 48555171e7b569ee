package singleflight

import (
	"bufio"
	"context"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func drain(b *testing.B, r *Reader) {
	defer r.Close()
	for {
		if _, err := r.Next(context.Background()); err != nil {
			if err != io.EOF {
				b.Fatal(err)
			}
			return
		}
	}
}

// BenchmarkOwnerPath is one flight with one caller and a unique key: what dedupe costs a
// request nobody else shares. The baseline is calling the function directly.
func BenchmarkOwnerPath(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			_, _ = instant(context.Background(), nil)
		}
	})
	b.Run("memory", func(b *testing.B) {
		g := New(Options{ResultTTL: time.Minute})
		defer g.Close(context.Background())
		for b.Loop() {
			r, _ := g.Do(uniqueKey(), false, instant)
			drain(b, r)
		}
	})
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		rdb := srv.Client()
		cnt := &cmdCounter{}
		rdb.AddHook(cnt)
		g := New(Options{Redis: rdb, ResultTTL: time.Minute})
		defer g.Close(context.Background())
		ctx := context.Background()
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			r, _ := g.Do(uniqueKey(), false, instant)
			drain(b, r)
		}
		b.ReportMetric(float64(cnt.n.Load())/float64(b.N), "redis-cmds/op")
		b.ReportMetric(float64(redisBusy(b, rdb).Microseconds())/float64(b.N), "redis-µs/op")
	})
}

// redisBusy is the time Redis spent running scripts since its statistics were last reset:
// INFO commandstats' usec of EVAL and EVALSHA. A script's own commands have lines of
// their own too, their time already in the script's: they are not added again.
func redisBusy(b *testing.B, rdb redis.UniversalClient) time.Duration {
	return redisTime(b, rdb, func(cmd string) bool { return cmd == "eval" || cmd == "evalsha" })
}

// redisTime is the time Redis spent on the commands that keep takes (commandstats names)
// since its statistics were last reset.
func redisTime(b *testing.B, rdb redis.UniversalClient, keep func(cmd string) bool) time.Duration {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found || !keep(name) {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatalf("commandstats %q: %v", line, err)
				}
				total += time.Duration(us) * time.Microsecond
			}
		}
	}
	return total
}

// BenchmarkFollowerWakeLag measures, for a follower on another instance, the time from the
// owner's function returning to the follower's reader seeing the end of the response.
func BenchmarkFollowerWakeLag(b *testing.B) {
	srv := redistest.Start(b)
	o := Options{Redis: srv.Client()}
	owner := New(o)
	defer owner.Close(context.Background())
	o.Redis = srv.Client()
	follower := New(o)
	defer follower.Close(context.Background())
	var total time.Duration
	for b.Loop() {
		key := uniqueKey()
		gate := make(chan struct{})
		var returned atomic.Int64
		running := make(chan struct{})
		fn := func(ctx context.Context, w *Writer) (Result, error) {
			close(running)
			<-gate
			returned.Store(time.Now().UnixNano())
			return Result{Head: Head{Status: 200}, Body: []byte("x")}, nil
		}
		ro, _ := owner.Do(key, false, fn)
		<-running
		rf, _ := follower.Do(key, false, fn)
		// Wait until the follower follows (its first read is blocked), then release.
		for follower.flightRole(key) != RoleFollower {
			runtime.Gosched()
		}
		close(gate)
		drain(b, rf)
		total += time.Duration(time.Now().UnixNano() - returned.Load())
		drain(b, ro)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "lag-µs/op")
}

// BenchmarkWaitingFollowerMemory reports the heap held per waiting caller: local callers
// of one flight, and remote flights followed (one per key) on another instance.
func BenchmarkWaitingFollowerMemory(b *testing.B) {
	for _, tc := range []struct {
		name string
		keys int
		per  int
	}{{"local-callers", 1, 1000}, {"remote-flights", 1000, 1}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := redistest.Start(b)
			o := Options{Redis: srv.Client()}
			owner := New(o)
			defer owner.Close(context.Background())
			o.Redis = srv.Client()
			follower := New(o)
			defer follower.Close(context.Background())
			for b.Loop() {
				gate := make(chan struct{})
				hold := func(ctx context.Context, w *Writer) (Result, error) {
					<-gate
					return Result{Head: Head{Status: 200}}, nil
				}
				keys := make([]string, tc.keys)
				var owned []*Reader
				for i := range keys {
					keys[i] = uniqueKey()
					r, _ := owner.Do(keys[i], false, hold)
					owned = append(owned, r)
				}
				for owner.Owned() < tc.keys {
					runtime.Gosched()
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				var waiting []*Reader
				for _, k := range keys {
					for range tc.per {
						r, _ := follower.Do(k, false, hold)
						waiting = append(waiting, r)
					}
				}
				for _, k := range keys {
					for follower.flightRole(k) != RoleFollower {
						runtime.Gosched()
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				used := int64(after.HeapAlloc+after.StackInuse) - int64(before.HeapAlloc+before.StackInuse)
				b.ReportMetric(float64(used)/float64(len(waiting)), "B/waiter")
				close(gate)
				for _, r := range append(owned, waiting...) {
					drain(b, r)
				}
			}
		})
	}
}

// BenchmarkAfterQuiet times calls made after 50 ms of quiet, as a lone client's are when
// the upstream takes 50 ms: caches and idle CPUs then make each Redis round trip cost
// several times what it costs back to back. A PING, a one-line script, and a whole owner
// flight (lookup-and-claim, complete) with an instant owner function on each backend. Run
// with a small -benchtime, such as 40x.
func BenchmarkAfterQuiet(b *testing.B) {
	srv := redistest.Start(b)
	rdb := srv.Client()
	ctx := context.Background()
	quiet := func(b *testing.B, call func()) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			time.Sleep(50 * time.Millisecond)
			b.StartTimer()
			call()
		}
	}
	b.Run("ping", func(b *testing.B) {
		quiet(b, func() { rdb.Ping(ctx) })
	})
	// The floor under any client: a PING written to a plain socket and its reply read,
	// after the same quiet and back to back. What the quiet adds here is the machine's
	// (waking Redis and this process), not the client library's nor the proxy's.
	conn, err := net.Dial("tcp", rdb.Options().Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	rawPing := func() {
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			b.Fatal(err)
		}
		if l, err := br.ReadString('\n'); err != nil || l != "+PONG\r\n" {
			b.Fatalf("PING: %q, %v", l, err)
		}
	}
	b.Run("ping-plain-socket", func(b *testing.B) {
		quiet(b, rawPing)
	})
	b.Run("ping-plain-socket-back-to-back", func(b *testing.B) {
		for b.Loop() {
			rawPing()
		}
	})
	one := redis.NewScript("return 1")
	b.Run("script", func(b *testing.B) {
		quiet(b, func() { one.Run(ctx, rdb, nil) })
	})
	for _, o := range []Options{{}, {Redis: rdb}} {
		g := New(o)
		b.Run("flight-"+g.Backend(), func(b *testing.B) {
			quiet(b, func() {
				r, _ := g.Do(uniqueKey(), false, instant)
				drain(b, r)
			})
		})
		_ = g.Close(ctx)
	}
}

// BenchmarkCompleteScript is the Redis time of one final write (complete.lua, answer
// stored, a subscriber on its channel), against the same commands sent plain in a
// pipeline: what running them from Lua costs on top of the commands themselves. Flights
// are claimed beforehand; the writes go in pipelines of 256, as the coalescer sends a herd's.
func BenchmarkCompleteScript(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"An answer of a sentence or two, as a short chat completion has."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}`)
	header := `{"Content-Type":["application/json"]}`
	for _, plain := range []bool{false, true} {
		name := map[bool]string{false: "script", true: "plain-commands"}[plain]
		b.Run(name, func(b *testing.B) {
			srv := redistest.Start(b)
			rdb := srv.Client()
			ctx := context.Background()
			g := New(Options{Redis: srv.Client(), ResultTTL: time.Minute})
			defer g.Close(ctx)
			for _, s := range []*redis.Script{lookupScript, completeScript} {
				if err := s.Load(ctx, rdb).Err(); err != nil {
					b.Fatal(err)
				}
			}
			keys := make([]flightKeys, b.N)
			channels := make([]string, b.N)
			p := rdb.Pipeline()
			for i := range keys {
				keys[i] = g.rem().keys(uniqueKey())
				channels[i] = keys[i].stream
				lookupScript.EvalSha(ctx, p, []string{keys[i].meta, keys[i].result, keys[i].stream},
					"0", "tok"+strconv.Itoa(i), "bench", 3000, 60000, 5000, 0, "/v1/chat/completions", "m")
				if p.Len() == 256 || i == len(keys)-1 {
					if _, err := p.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			ps := rdb.Subscribe(ctx, channels...)
			defer ps.Close()
			go func() {
				for range ps.Channel() {
				}
			}()
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i, k := range keys {
				tok := "tok" + strconv.Itoa(i)
				if plain {
					p.HMGet(ctx, k.meta, "state", "token", "n")
					p.Time(ctx)
					p.XAdd(ctx, &redis.XAddArgs{Stream: k.stream, Values: []any{"t", "done", "tok", tok, "n", 1, "s", 200, "h", header, "d", body, "landed", "1764590000000000"}})
					p.Publish(ctx, k.stream, body)
					p.HSet(ctx, k.result, "status", 200, "header", header, "body", body, "at", 1764590000000, "token", tok, "landed", "1764590000000000")
					p.PExpire(ctx, k.result, time.Minute)
					p.HSet(ctx, k.meta, "state", "D", "lease_until", 0, "n", 1)
					p.PExpire(ctx, k.meta, 5*time.Second)
					p.PExpire(ctx, k.stream, 5*time.Second)
				} else {
					completeScript.EvalSha(ctx, p, []string{k.meta, k.stream, k.result},
						tok, 0, 0, 200, header, body, body, "1", 60000, 5000, "bench", 1, "", 0, 3000, 60000)
				}
				if (i+1)%256 == 0 || i == len(keys)-1 {
					if _, err := p.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			// The script's time already holds its commands'; the plain commands are all
			// the clients sent but the harness's INFO and CONFIG.
			keep := func(cmd string) bool { return cmd == "evalsha" }
			if plain {
				keep = func(cmd string) bool { return cmd != "info" && !strings.HasPrefix(cmd, "config|") }
			}
			b.ReportMetric(float64(redisTime(b, rdb, keep).Nanoseconds())/1e3/float64(b.N), "redis-µs/op")
		})
	}
}
