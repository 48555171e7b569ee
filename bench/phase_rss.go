package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// rssRow is the memory one instance holds per waiting request.
type rssRow struct {
	Case          string         `json:"case"`
	N             int            `json:"waiting"`
	BaseRSS       int64          `json:"base_rss_bytes"`
	RSS           int64          `json:"rss_bytes"`
	PerRequest    float64        `json:"rss_bytes_per_waiting_request"`
	Goroutines    float64        `json:"goroutines"`
	FDs           int            `json:"open_fds"`
	RedisClients  int            `json:"redis_connected_clients"`
	RedisBlocked  int            `json:"redis_blocked_clients"`
	SettleSeconds float64        `json:"seconds_until_all_waiting"`
	OK            int            `json:"answered_200"`
	Errors        int            `json:"errors"`
	Roles         map[string]int `json:"roles"`
	// RedisClients counts every process connected to Redis (the harness, the idle instances
	// of the other measurements too); RedisConns is the measured instance's share of it, and
	// OwnerRedisConns the owner process's, when another instance owns the calls.
	RedisConns      int `json:"redis_connections_of_instance"`
	OwnerRedisConns int `json:"redis_connections_of_owner_process,omitempty"`
	// Redis commands per second while the requests wait (every client of the server:
	// the measured instance, and for remote calls the owner process renewing leases).
	WaitCmds map[string]float64 `json:"redis_commands_per_second_while_waiting"`
	// ReleaseCmds are the commands clients sent Redis from the release to the last answer.
	ReleaseCmds map[string]float64 `json:"redis_commands_during_release,omitempty"`
	// ReleaseSeconds is from the release of the held calls to the last answer.
	ReleaseSeconds float64 `json:"seconds_from_release_to_last_answer"`
	// OwnersDoneSeconds is, when another instance owns the calls, from the release to its
	// owners' last final write, as the owner process measures it.
	OwnersDoneSeconds float64 `json:"seconds_from_release_to_owners_done,omitempty"`
	// AfterOwnerWrite is, for each followed answer, from its owner's final write to the
	// last byte at the client: the measured instance's share of the release.
	AfterOwnerWrite *summary `json:"from_owner_write_to_answer,omitempty"`
	// ReleaseCPU is the CPU time each process used from the release to the last answer:
	// where the release's time went, on a machine whose CPUs they all share.
	ReleaseCPU []procCPU `json:"cpu_during_release,omitempty"`
	Note       string    `json:"note,omitempty"`
}

// procCPU is the CPU time one process used during a measurement.
type procCPU struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	pid     int
	start   time.Duration
}

// startCPU reads the CPU time used so far by each named process (pid 0: this one).
func startCPU(names []string, pids []int) []procCPU {
	out := make([]procCPU, len(names))
	for i, name := range names {
		out[i] = procCPU{Name: name, pid: pids[i], Seconds: -1}
		var err error
		if out[i].start, err = cpuTime(pids[i]); err != nil {
			out[i].pid = -1 // unknown
		}
	}
	return out
}

// stopCPU sets the CPU time each process used since startCPU; -1 when it could not be read.
func stopCPU(ps []procCPU) []procCPU {
	for i := range ps {
		if ps[i].pid < 0 {
			continue
		}
		if t, err := cpuTime(ps[i].pid); err == nil {
			ps[i].Seconds = (t - ps[i].start).Seconds()
		}
	}
	return ps
}

// cpuNote says where the release's CPU time went, for the table's note. /proc counts in
// hundredths of a second: a figure under 0.05 s is shown as such.
func cpuNote(ps []procCPU) string {
	var parts []string
	for _, p := range ps {
		switch {
		case p.Seconds < 0:
			parts = append(parts, p.Name+" unknown")
		case p.Seconds < 0.05:
			parts = append(parts, p.Name+" < 0.05 s")
		default:
			parts = append(parts, fmt.Sprintf("%s %.2f s", p.Name, p.Seconds))
		}
	}
	return "CPU during the release: " + strings.Join(parts, ", ")
}

// joinNote appends more to a table note.
func joinNote(note, more string) string {
	if note = strings.TrimSpace(note); note == "" {
		return more
	}
	return note + "; " + more
}

const (
	rssOneKey     = "one prompt, its call running on this instance"
	rssRemoteKeys = "distinct prompts, each call running on another instance"
	rssOwnedKeys  = "distinct prompts, each call running on this instance"
	rssOwnedTLS   = "distinct prompts, each call running on this instance, the upstream over HTTPS (HTTP/2, as api.openai.com)"
	rssDirect     = "baseline: the fake upstream (a plain Go net/http server) holding the requests itself"
)

// rss measures, for each case and size, a fresh proxy instance: RSS when idle (after a
// warm-up) and when n client requests are waiting for held upstream calls.
func (e *env) rss(ctx context.Context, c cfg, fdLimit uint64) ([]rssRow, error) {
	var rows []rssRow
	for _, n := range c.rssSizes {
		for _, kind := range []string{rssDirect, rssOneKey, rssRemoteKeys, rssOwnedKeys, rssOwnedTLS} {
			row, err := e.rssCase(ctx, kind, n, fdLimit)
			if err != nil {
				return rows, fmt.Errorf("%s, %d: %w", kind, n, err)
			}
			logf("  %-58s n=%-5d %6.1f KiB/request (RSS %d → %d MiB; %d goroutines, %d fds; %d ok, %d errors) %s",
				kind, row.N, row.PerRequest/1024, row.BaseRSS>>20, row.RSS>>20, int(row.Goroutines), row.FDs, row.OK, row.Errors, row.Note)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func (e *env) rssCase(ctx context.Context, kind string, n int, fdLimit uint64) (rssRow, error) {
	row := rssRow{Case: kind, N: n, Roles: map[string]int{}}
	if kind == rssOwnedKeys && uint64(2*n+1024) > fdLimit {
		// The instance holds a client and an upstream connection per request.
		row.N = int(fdLimit-1024) / 2
		n = row.N
		row.Note = fmt.Sprintf("%d, not more: an instance holding two connections per request needs 2N fds and the open-file limit here is %d", n, fdLimit)
	}
	if kind == rssOwnedTLS && uint64(n+1024) > fdLimit {
		row.N = int(fdLimit - 1024)
		n = row.N
		row.Note = fmt.Sprintf("%d, not more: the open-file limit here is %d", n, fdLimit)
	}
	if err := e.setFake(ctx, behavior{}); err != nil {
		return row, err
	}
	if kind == rssDirect {
		return e.rssDirect(ctx, row)
	}
	// up is the upstream: the shared fake, or for the HTTPS case one of its own, which the
	// instance trusts through SSL_CERT_FILE (Go reads it on Linux) and reaches over HTTP/2,
	// one connection carrying many calls, as it reaches api.openai.com.
	up, extraEnv := e, []string(nil)
	if kind == rssOwnedTLS {
		cert := filepath.Join(e.dir, fmt.Sprintf("fake-%d.pem", n))
		fake, fakeURL, err := startFake(&e.ps, e.dir, filepath.Join(e.dir, "bin", "fakeupstream"), cert)
		if err != nil {
			return row, err
		}
		defer e.ps.remove(fake)
		cl, err := newTLSClient(cert)
		if err != nil {
			return row, err
		}
		defer cl.tr.CloseIdleConnections()
		up, extraEnv = &env{c: cl, fakeURL: fakeURL}, []string{"SSL_CERT_FILE=" + cert}
	}
	p, base, err := startProxy(ctx, &e.ps, e.dir, e.proxyBin, fmt.Sprintf("proxy-rss-%d", time.Now().UnixNano()), up.fakeURL, e.redisAddr(), extraEnv...)
	if err != nil {
		return row, err
	}
	defer e.ps.remove(p)
	url := chatURL(base)
	for i := range 50 { // warm-up: pools, lazily built state
		e.c.post(ctx, url, chatBody(fmt.Sprintf("%s rss warm %s %d %d", e.runID, kind, n, i), false), false)
	}
	time.Sleep(time.Second)
	if row.BaseRSS, err = rssBytes(p.pid()); err != nil {
		return row, err
	}

	bodies := make([][]byte, n)
	for i := range bodies {
		content := fmt.Sprintf("%s rss %s %d #%d", e.runID, kind, n, i)
		if kind == rssOneKey {
			content = fmt.Sprintf("%s rss %s %d", e.runID, kind, n)
		}
		bodies[i] = chatBody(content, false)
	}
	release := func() error { return up.releaseFake(ctx) }
	var owners *ownerProc
	if kind == rssRemoteKeys {
		var err error
		owners, err = e.startOwners(ctx, bodies)
		if err != nil {
			return row, err
		}
		defer owners.close(&e.ps)
		release = owners.release
	} else if err := up.setFake(ctx, behavior{Hold: true}); err != nil {
		return row, err
	}

	// Each waiting request has its own connection: a client of its own, so that they are
	// all closed afterwards.
	cl := newClient()
	defer cl.tr.CloseIdleConnections()
	replies := make([]reply, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, b := range bodies {
		if i%500 == 499 {
			time.Sleep(50 * time.Millisecond) // do not overflow the listen backlog
		}
		wg.Go(func() { replies[i] = cl.post(ctx, url, b, false) })
	}
	if err := e.waitFor(ctx, 120*time.Second, func() (bool, error) {
		v, err := e.metric(ctx, base, "llm_dedupe_waiting_requests")
		return v >= float64(n), err
	}); err != nil {
		row.Note = "not all waiting: " + err.Error()
	}
	row.SettleSeconds = time.Since(start).Seconds()
	time.Sleep(time.Second) // blocked reads and goroutines settle
	before, err := e.commandStats(ctx)
	if err != nil {
		return row, err
	}
	const window = 3 * time.Second
	time.Sleep(window)
	after, err := e.commandStats(ctx)
	if err != nil {
		return row, err
	}
	row.WaitCmds = sentBetween(before, after, window.Seconds())
	if row.RSS, err = rssBytes(p.pid()); err != nil {
		return row, err
	}
	row.PerRequest = float64(row.RSS-row.BaseRSS) / float64(n)
	row.Goroutines, _ = e.metric(ctx, base, "go_goroutines")
	row.FDs = countFDs(p.pid())
	row.RedisClients, row.RedisBlocked = e.redisClients(ctx)
	row.RedisConns = tcpConnsTo(p.pid(), e.redisAddr())
	if owners != nil {
		row.OwnerRedisConns = tcpConnsTo(owners.p.pid(), e.redisAddr())
	}
	if degraded, _ := e.metric(ctx, base, "llm_dedupe_backend_degraded"); degraded > 0 {
		row.Note += " instance degraded to local-only dedupe"
	}

	if before, err = e.commandStats(ctx); err != nil {
		return row, err
	}
	cpu := startCPU([]string{"this instance", "Redis", "load generator"}, []int{p.pid(), e.redis.pid(), 0})
	released := time.Now()
	if err := release(); err != nil {
		return row, err
	}
	wg.Wait()
	row.ReleaseSeconds = time.Since(released).Seconds()
	row.ReleaseCPU = stopCPU(cpu)
	if after, err = e.commandStats(ctx); err != nil {
		return row, err
	}
	row.ReleaseCmds = sentBetween(before, after, 1)
	if owners != nil {
		// How much of the release is the other instance's: its owners' final writes, which
		// the owner process times from when it read the release. Its report is read only
		// after the last answer, so that the harness stays out of the proxy's way meanwhile.
		rep, err := owners.done(ctx)
		if err != nil {
			return row, err
		}
		row.OwnersDoneSeconds = rep.DoneSeconds
		row.ReleaseCPU = append(row.ReleaseCPU, procCPU{Name: "owner process (to its last write)", Seconds: rep.CPUSeconds})
		// "Release → last answer" starts the clock before the other instance has written
		// anything, and its 10,000 final writes take seconds: that is the other instance's
		// work, not the measured one's. So each followed answer is also timed from its own
		// owner's final write. The two clocks start when the release line is written and
		// when it is read, so each lag includes that pipe's latency.
		var lags []time.Duration
		for i, r := range replies {
			if r.ok() && r.role == "follower" && i < len(rep.EndSeconds) {
				lags = append(lags, r.end.Sub(released)-time.Duration(rep.EndSeconds[i]*float64(time.Second)))
			}
		}
		if len(lags) > 0 {
			s := summarize(lags)
			row.AfterOwnerWrite = &s
			row.Note = strings.TrimSpace(fmt.Sprintf("%s the owner process had written all its answers %.2f s after the release; each followed answer reached its client %.1f ms after its owner's final write (p50; p99 %.1f ms, max %.1f ms)",
				row.Note, row.OwnersDoneSeconds, s.P50, s.P99, s.Max))
		}
		if rep.LeasesLost > 0 || rep.RenewalsFailed > 0 {
			row.Note = strings.TrimSpace(fmt.Sprintf("%s; the owner process lost %d leases (%d renewals failed)", row.Note, rep.LeasesLost, rep.RenewalsFailed))
		}
	}
	for _, r := range replies {
		if r.ok() {
			row.OK++
			row.Roles[r.role]++
		} else {
			row.Errors++
		}
	}
	if n := row.Roles["owner"]; owners != nil && n > 0 {
		// A follower that saw its owner's lease run out took the call over, and the fake
		// upstream (not held in this case) answered it at once: those requests were not
		// waiting when the figures were taken.
		row.Note = strings.TrimSpace(fmt.Sprintf("%s %d calls taken over by this instance: the owner process's leases ran out", row.Note, n))
	}
	row.Note = joinNote(row.Note, cpuNote(row.ReleaseCPU))
	if len(row.ReleaseCmds) > 0 {
		row.Note = joinNote(row.Note, "Redis commands sent during the release: "+wholeCounts(row.ReleaseCmds))
	}
	_ = e.setFake(ctx, behavior{})
	return row, nil
}

// rssDirect holds n requests in a fresh fake upstream (the shared one has grown a log of
// every call by now): what a bare Go HTTP server spends per waiting request, plus the
// fake's record of each call (about 1.3 KB).
func (e *env) rssDirect(ctx context.Context, row rssRow) (rssRow, error) {
	n := row.N
	fake, fakeURL, err := startFake(&e.ps, e.dir, filepath.Join(e.dir, "bin", "fakeupstream"))
	if err != nil {
		return row, err
	}
	defer e.ps.remove(fake)
	fe := &env{c: e.c, fakeURL: fakeURL}
	if err := fe.setFake(ctx, behavior{Hold: true}); err != nil {
		return row, err
	}
	for i := range 50 { // warm-up, as for the proxy
		go fe.c.post(ctx, chatURL(fakeURL), chatBody(fmt.Sprintf("%s rss direct warm %d", e.runID, i), false), false)
	}
	if err := fe.waitFor(ctx, 10*time.Second, func() (bool, error) {
		c, err := fe.fakeCalls(ctx)
		return c >= 50, err
	}); err != nil {
		return row, err
	}
	if err := fe.releaseFake(ctx); err != nil {
		return row, err
	}
	if err := fe.setFake(ctx, behavior{Hold: true}); err != nil {
		return row, err
	}
	time.Sleep(time.Second)
	base, err := rssBytes(fake.pid())
	if err != nil {
		return row, err
	}
	row.BaseRSS = base
	before, err := fe.fakeCalls(ctx)
	if err != nil {
		return row, err
	}
	cl := newClient()
	defer cl.tr.CloseIdleConnections()
	replies := make([]reply, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		if i%500 == 499 {
			time.Sleep(50 * time.Millisecond)
		}
		wg.Go(func() {
			replies[i] = cl.post(ctx, chatURL(fakeURL), chatBody(fmt.Sprintf("%s rss direct %d #%d", e.runID, n, i), false), false)
		})
	}
	if err := fe.waitFor(ctx, 120*time.Second, func() (bool, error) {
		c, err := fe.fakeCalls(ctx)
		return c-before >= int64(n), err
	}); err != nil {
		row.Note = "not all waiting: " + err.Error()
	}
	row.SettleSeconds = time.Since(start).Seconds()
	time.Sleep(4 * time.Second) // as long as the proxy cases settle
	if row.RSS, err = rssBytes(fake.pid()); err != nil {
		return row, err
	}
	row.PerRequest = float64(row.RSS-row.BaseRSS) / float64(n)
	row.FDs = countFDs(fake.pid())
	cpu := startCPU([]string{"server", "load generator"}, []int{fake.pid(), 0})
	released := time.Now()
	if err := fe.releaseFake(ctx); err != nil {
		return row, err
	}
	wg.Wait()
	row.ReleaseSeconds = time.Since(released).Seconds()
	row.ReleaseCPU = stopCPU(cpu)
	row.Note = joinNote(row.Note, cpuNote(row.ReleaseCPU))
	for _, r := range replies {
		if r.ok() {
			row.OK++
		} else {
			row.Errors++
		}
	}
	return row, nil
}

func (e *env) waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.Join(fmt.Errorf("condition not met within %v", limit), last)
}

func (e *env) redisClients(ctx context.Context) (connected, blocked int) {
	s, err := e.rdb.Info(ctx, "clients").Result()
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		n, _ := strconv.Atoi(v)
		switch k {
		case "connected_clients":
			connected = n
		case "blocked_clients":
			blocked = n
		}
	}
	return connected, blocked
}

func countFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(ents)
}

// sentBetween is, for each command clients sent, how many more calls after has than
// before (commandStats), divided by per: counts, or with per in seconds, rates.
func sentBetween(before, after map[string]int64, per float64) map[string]float64 {
	out := map[string]float64{}
	for cmd, v := range after {
		if d := v - before[cmd]; sentByClient(cmd) && d > 0 {
			out[cmd] = float64(d) / per
		}
	}
	return out
}
