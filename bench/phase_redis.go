package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// redisRow is Redis work per request on one path: commands the proxy sent (round trips)
// and the commands its scripts ran inside Redis, from INFO commandstats.
type redisRow struct {
	Path       string             `json:"path"`
	Requests   int                `json:"requests"`
	RoundTrips float64            `json:"round_trips_per_request"`
	InScripts  float64            `json:"script_commands_per_request"`
	Sent       map[string]float64 `json:"sent_per_request"`
	Scripted   map[string]float64 `json:"scripted_per_request"`
}

// sentByClient are the commands a client sends itself; every other command in
// commandstats was run by a script (Redis counts those too).
func sentByClient(cmd string) bool {
	switch {
	case strings.HasPrefix(cmd, "eval"), strings.HasPrefix(cmd, "fcall"), strings.HasPrefix(cmd, "client|"),
		strings.HasPrefix(cmd, "script|"), cmd == "xread", cmd == "ping", cmd == "hello", cmd == "select", cmd == "auth":
		return true
	}
	return false
}

// harnessCommand are the harness's own commands, left out of the counts.
func harnessCommand(cmd string) bool { return cmd == "info" || strings.HasPrefix(cmd, "config|") }

func (e *env) commandStats(ctx context.Context) (map[string]int64, error) {
	s, err := e.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found || harnessCommand(name) {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[name] = n
			}
		}
	}
	return out, nil
}

// countCommands runs work once to warm the proxies' connection pools (a new connection
// costs a HELLO), resets the statistics, runs it again with new prompts, and returns the
// commands per request.
func (e *env) countCommands(ctx context.Context, path string, requests int, work func(tag string) error) (redisRow, error) {
	if err := work("warm"); err != nil {
		return redisRow{}, err
	}
	if err := e.rdb.ConfigResetStat(ctx).Err(); err != nil {
		return redisRow{}, err
	}
	if err := work("measured"); err != nil {
		return redisRow{}, err
	}
	stats, err := e.commandStats(ctx)
	if err != nil {
		return redisRow{}, err
	}
	row := redisRow{Path: path, Requests: requests, Sent: map[string]float64{}, Scripted: map[string]float64{}}
	for cmd, n := range stats {
		v := float64(n) / float64(requests)
		if sentByClient(cmd) {
			row.Sent[cmd] = v
			row.RoundTrips += v
		} else {
			row.Scripted[cmd] = v
			row.InScripts += v
		}
	}
	logf("  %-44s %.2f round trips/request (%s), %.2f commands in scripts", path, row.RoundTrips, breakdown(row.Sent), row.InScripts)
	return row, nil
}

// breakdown formats per-command counts, largest first.
func breakdown(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		if m[k] >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s %.2f", strings.ToUpper(k), m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// redisCommands counts Redis commands on the owner, hit and follower paths. Follower
// rows are measured as owner+follower pairs with the owner's own cost subtracted.
func (e *env) redisCommands(ctx context.Context, c cfg) ([]redisRow, error) {
	n := c.redisN
	var rows []redisRow
	// seq sends n requests, 8 at a time.
	seq := func(url string, body func(tag string, i int) []byte) func(string) error {
		return func(tag string) error {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			var failed atomic.Int64
			for i := range n {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					if r := e.c.post(ctx, url, body(tag, i), false); !r.ok() {
						failed.Add(1)
					}
				})
			}
			wg.Wait()
			if f := failed.Load(); f > 0 {
				return fmt.Errorf("%d of %d requests failed", f, n)
			}
			return nil
		}
	}
	// pairs sends owner+follower pairs. Which of the two owns is decided in Redis: when
	// the first one's claim is slower than the offset (pairs run 8 at a time), the second
	// one owns and the first follows. Either way a pair is one owner and one follower.
	pairs := func(s lagSpec, kind string, offset time.Duration) func(string) error {
		return func(tag string) error {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			var bad int
			var mu sync.Mutex
			for i := range n {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					o, fs := e.trial(ctx, s, chatBody(fmt.Sprintf("%s redis %s %s #%d", e.runID, kind, tag, i), s.Stream), 1, offset)
					f := fs[0]
					if !o.ok() || !f.ok() || (o.role != "owner" && f.role != "owner") || (o.role != "follower" && f.role != "follower") {
						mu.Lock()
						bad++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if bad > 0 {
				return fmt.Errorf("%d of %d pairs were not one owner and one follower", bad, n)
			}
			return nil
		}
	}
	minus := func(pair, owner redisRow, path string) redisRow {
		r := redisRow{Path: path, Requests: pair.Requests, Sent: map[string]float64{}, Scripted: map[string]float64{}}
		for k, v := range pair.Sent {
			r.Sent[k] = v - owner.Sent[k]
		}
		for k, v := range pair.Scripted {
			r.Scripted[k] = v - owner.Scripted[k]
		}
		r.RoundTrips, r.InScripts = pair.RoundTrips-owner.RoundTrips, pair.InScripts-owner.InScripts
		logf("  %-44s %.2f round trips/request (%s), %.2f commands in scripts", path, r.RoundTrips, breakdown(r.Sent), r.InScripts)
		return r
	}

	// What one round trip costs, for scale: PINGs from the harness, one after another.
	var rtt []time.Duration
	for range 2000 {
		t := time.Now()
		if err := e.rdb.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		rtt = append(rtt, time.Since(t))
	}
	s := summarize(rtt)
	rows = append(rows, redisRow{Path: fmt.Sprintf("one round trip (PING from go-redis): p50 %.0f µs, p99 %.0f µs", s.P50*1000, s.P99*1000), Requests: len(rtt), RoundTrips: 1, Sent: map[string]float64{"ping": 1}})
	logf("  %s", rows[0].Path)

	// Unary: upstream 50ms (no lease renewal falls inside a call that short).
	if err := e.setFake(ctx, behavior{Delay: 50 * time.Millisecond}); err != nil {
		return nil, err
	}
	unary := func(tag string, i int) []byte {
		return chatBody(fmt.Sprintf("%s redis unary %s #%d", e.runID, tag, i), false)
	}
	owner, err := e.countCommands(ctx, "owner (unary)", n, seq(chatURL(e.proxy[0]), unary))
	if err != nil {
		return nil, fmt.Errorf("owner: %w", err)
	}
	rows = append(rows, owner)
	// Hits: the answers the owner rows stored, read through another instance.
	row, err := e.countCommands(ctx, "hit", n, seq(chatURL(e.proxy[1]), unary))
	if err != nil {
		return nil, fmt.Errorf("hit: %w", err)
	}
	rows = append(rows, row)
	specs := e.lagSpecs(false)
	for _, s := range specs[:2] {
		pair, err := e.countCommands(ctx, "owner + follower, "+s.Where+" (unary)", n, pairs(s, "u"+s.Where, 10*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		rows = append(rows, minus(pair, owner, "follower, "+s.Where+" (unary)"))
	}

	// Streams: 10 chunks 20ms apart; appends are batched every 5ms.
	if err := e.setFake(ctx, behavior{Delay: 20 * time.Millisecond, Chunks: 10}); err != nil {
		return nil, err
	}
	stream := func(tag string, i int) []byte {
		return chatBody(fmt.Sprintf("%s redis stream %s #%d", e.runID, tag, i), true)
	}
	sowner, err := e.countCommands(ctx, "owner (stream, 10 chunks 20ms apart)", n, seq(chatURL(e.proxy[0]), stream))
	if err != nil {
		return nil, fmt.Errorf("stream owner: %w", err)
	}
	rows = append(rows, sowner)
	sp := e.lagSpecs(true)[1]
	pair, err := e.countCommands(ctx, "owner + follower, other instance (stream)", n, pairs(sp, "s", 5*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("stream pair: %w", err)
	}
	rows = append(rows, minus(pair, sowner, "follower, other instance (stream)"))
	return rows, nil
}
