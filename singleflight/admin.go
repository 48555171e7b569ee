package singleflight

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// FlightInfo describes one flight in progress, for operators.
type FlightInfo struct {
	Key string
	// State is running, failed (a waiter is to take over) or expired (lease run out).
	State     string
	Owner     string        // instance id of the owner of the current attempt
	Attempt   int           // the current attempt, from 1
	Age       time.Duration // since the current attempt began
	LeaseLeft time.Duration // what remains of the owner's lease (Redis only)
	Route     string
	Model     string
	// Waiting is how many callers wait for the flight, by instance id: the owner's as of its
	// last renewal, a follower instance's as of its last look (ADR 0074).
	Waiting map[string]int
}

// flightsScanBatch is one SCAN's COUNT; flightsMaxScans bounds them per server (ADR 0050).
const (
	flightsScanBatch = 500
	flightsMaxScans  = 200
)

// Flights lists up to limit flights in progress, oldest first: with Redis, every
// instance's; in memory, this process's. more says the listing stopped before the end.
func (g *Group) Flights(ctx context.Context, limit int) (list []FlightInfo, more bool, err error) {
	if limit <= 0 {
		limit = 1000
	}
	list, more, err = g.coord.flights(ctx, limit)
	sort.Slice(list, func(i, j int) bool { return list[i].Age > list[j].Age })
	return list, more, err
}

func (g *Group) localFlights(limit int) ([]FlightInfo, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []FlightInfo
	for _, f := range g.flights {
		f.mu.Lock()
		running := !f.ended && f.role != RoleHit
		info := FlightInfo{Key: f.key, State: "running", Owner: g.opts.InstanceID, Attempt: max(f.attempts, 1),
			Age: time.Since(f.started), Route: f.call.Route, Model: f.call.Model,
			Waiting: map[string]int{g.opts.InstanceID: f.waiting()}}
		f.mu.Unlock()
		if !running {
			continue
		}
		if len(out) == limit {
			return out, true
		}
		out = append(out, info)
	}
	return out, false
}

// flights scans each master of a Cluster, or the one server.
func (r *remote) flights(ctx context.Context, limit int) ([]FlightInfo, bool, error) {
	var (
		mu   sync.Mutex
		out  []FlightInfo
		more bool
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		list, m, err := r.scanFlights(ctx, c, limit)
		mu.Lock()
		defer mu.Unlock()
		out = append(out, list...)
		more = more || m
		return err
	}
	var err error
	if cc, ok := r.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, r.rdb)
	}
	if len(out) > limit {
		out, more = out[:limit], true
	}
	return out, more, err
}

// scanFlights SCANs one server for meta keys, then reads them with its TIME in a pipeline.
func (r *remote) scanFlights(ctx context.Context, c redis.Cmdable, limit int) ([]FlightInfo, bool, error) {
	prefix := r.g.opts.KeyPrefix + ":meta:{"
	keys, more, err := scanKeys(ctx, c, globEscape(prefix)+"*", 2*limit) // done and failed flights are skipped below
	if err != nil || len(keys) == 0 {
		return nil, more, err
	}
	pipe := c.Pipeline()
	now := pipe.Time(ctx)
	fields := make([]*redis.MapStringStringCmd, len(keys))
	for i, k := range keys {
		fields[i] = pipe.HGetAll(ctx, k) // the marks of followers' instances have their ids in their names
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, err
	}
	nowMs := now.Val().UnixMilli()
	var out []FlightInfo
	for i, k := range keys {
		info, ok := flightInfo(strings.TrimSuffix(strings.TrimPrefix(k, prefix), "}"), fields[i].Val(), nowMs)
		if !ok {
			continue // done, cut, or gone since the SCAN
		}
		if len(out) == limit {
			return out, true, nil
		}
		out = append(out, info)
	}
	return out, more, nil
}

// scanKeys SCANs one server for the keys match matches, until it has want of them or has
// scanned flightsMaxScans batches; more says it stopped before the end.
func scanKeys(ctx context.Context, c redis.Cmdable, match string, want int) (keys []string, more bool, err error) {
	var cursor uint64
	for range flightsMaxScans {
		batch, next, err := c.Scan(ctx, cursor, match, flightsScanBatch).Result()
		if err != nil {
			return nil, false, err
		}
		keys, cursor = append(keys, batch...), next
		if cursor == 0 {
			return keys, false, nil
		}
		if len(keys) >= want {
			return keys, true, nil
		}
	}
	return keys, true, nil
}

// flightInfo is what a running or failed flight's meta m says of it; false for any other.
func flightInfo(key string, m map[string]string, nowMs int64) (FlightInfo, bool) {
	state := m["state"]
	if state != "R" && state != "F" {
		return FlightInfo{}, false
	}
	v := []any{m["owner"], m["lease_until"], m["attempt"], m["created"], m["oc"]}
	info := FlightInfo{
		Key:     key,
		State:   "running",
		Owner:   str(v, 0),
		Attempt: int(num(v, 2)),
		Age:     time.Duration(nowMs-num(v, 3)) * time.Millisecond,
		Route:   m["route"],
		Model:   m["model"],
		Waiting: map[string]int{},
	}
	if _, ok := m["oc"]; ok { // written by each renewal
		info.Waiting[info.Owner] = int(num(v, 4))
	}
	for f, n := range m {
		if mark, ok := strings.CutPrefix(f, "w:"); ok {
			if id, _, _ := strings.Cut(mark, ":"); id != info.Owner {
				info.Waiting[id] += int(num([]any{n}, 0))
			}
		}
	}
	left := num(v, 1) - nowMs
	switch {
	case state == "F":
		info.State = "failed"
	case left <= 0:
		info.State = "expired"
	default:
		info.LeaseLeft = time.Duration(left) * time.Millisecond
	}
	return info, true
}

// globEscape escapes the characters SCAN MATCH gives a meaning to.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
