package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// machine describes where a run was measured.
type machine struct {
	CPUs   int    `json:"nproc"`
	CPU    string `json:"cpu"`
	Memory string `json:"memory"`
	Kernel string `json:"kernel"`
	OS     string `json:"os"`
	Go     string `json:"go"`
	Redis  string `json:"redis"`
	Nginx  string `json:"nginx"`
	Commit string `json:"commit"`
	// LoadBefore and LoadAfter are /proc/loadavg when the run started and ended: other
	// work on the machine shows here.
	LoadBefore string `json:"loadavg_before"`
	LoadAfter  string `json:"loadavg_after"`
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func describeMachine(ctx context.Context, e *env) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Nginx: nginxVersion()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"), "%d", &kb)
		m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if info, err := e.rdb.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				m.Redis = v
			}
		}
	}
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	return m
}

// report is the markdown of a run: the summary table first, then every measurement.
func report(r *results, raw string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	mode := "full run"
	if r.Config["quick"] == true {
		mode = "quick smoke run — too short to quote"
	}
	w("# Benchmarks\n\n")
	w("Measured by `%s` (%s, %d run(s) of each measurement, %.0f s in all) on %s. ",
		r.Command, mode, r.Config["runs"], r.Seconds, r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("Every figure is the median over runs of that run's percentile; the baseline of each row was measured in the same run, interleaved with it. ")
	w("Raw numbers: `%s` (not committed). How to read and reproduce them: [docs/benchmarks.md](docs/benchmarks.md).\n\n", raw)
	m := r.Machine
	w("| machine | |\n| --- | --- |\n")
	w("| CPUs (nproc) | %d × %s |\n| memory | %s |\n| OS, kernel | %s, Linux %s |\n", m.CPUs, m.CPU, m.Memory, m.OS, m.Kernel)
	w("| Go | %s |\n| Redis | %s |\n| nginx | %s |\n| commit | %s |\n| open-file limit | %d |\n| load average (1, 5, 15 min) before → after | %s → %s |\n\n", m.Go, m.Redis, m.Nginx, m.Commit, r.FDLimit, m.LoadBefore, m.LoadAfter)
	w("Everything — load generator, fake upstream, Redis, proxies, nginx — runs on this one machine over loopback and shares its CPUs, so absolute throughput is the machine's, not the proxy's alone.\n\n")

	for _, f := range r.Failures {
		w("**Failed:** %s\n\n", f)
	}
	summaryTable(&b, r)
	ownerSection(&b, r)
	hitSection(&b, r)
	traceSection(&b, r)
	lagSection(&b, "Follower completion lag (unary)", "A request is sent, and 10 ms later (its 50 ms upstream call under way) duplicates of it. Lag = when a duplicate's client got its last byte minus when the first request's client got its last byte.", r.Lag)
	lagSection(&b, "Streaming: follower first-chunk lag", "A streamed request is sent (the upstream sends 10 chunks 20 ms apart), and 5 ms later duplicates of it. Lag = when a duplicate's client got its first body byte minus when the first request's client got its first body byte.", r.Stream)
	dupSection(&b, r)
	redisSection(&b, r)
	rssSection(&b, r)
	profileSection(&b, r)
	w("## nginx configuration\n\nEach nginx instance has its own cache directory (`proxy_cache_path … keys_zone=llm:16m`), `worker_processes auto`, keep-alive to the upstream; the location is:\n\n```nginx\n%s\n```\n", nginxLocation)
	return b.String()
}

func cell(cells []latencyCell, prefix string, conc int) (latencyCell, bool) {
	for _, c := range cells {
		if strings.HasPrefix(c.Target, prefix) && c.Conc == conc {
			return c, true
		}
	}
	return latencyCell{}, false
}

func f2(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func pp(p50, p99 float64) string { return f2(p50) + " / " + f2(p99) + " ms" }

func summaryTable(b *strings.Builder, r *results) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Summary\n\n| measurement (p50 / p99) | direct to upstream | llm-dedupe-proxy | nginx proxy_cache_lock |\n| --- | --- | --- | --- |\n")
	for _, conc := range []int{1, 32, 16} {
		d, ok1 := cell(r.Owner, "direct", conc)
		p, ok2 := cell(r.Owner, "llm-dedupe-proxy (", conc)
		n, ok3 := cell(r.Owner, "nginx", conc)
		if ok1 && ok2 {
			w("| new request, upstream 50 ms, %d client(s) | %s | %s (+%s ms) | %s |\n", conc, pp(d.P50, d.P99), pp(p.P50, p.P99), f2(p.P50-d.P50), ifOK(ok3, pp(n.P50, n.P99)+" (+"+f2(n.P50-d.P50)+" ms)"))
		}
	}
	if d, ok := cell(r.Hit, "direct", 1); ok {
		p, _ := cell(r.Hit, "llm-dedupe-proxy (", 1)
		n, okn := cell(r.Hit, "nginx", 1)
		w("| stored answer (hit), 1 client | %s (upstream at 0 ms) | %s | %s |\n", pp(d.P50, d.P99), pp(p.P50, p.P99), ifOK(okn, pp(n.P50, n.P99)))
	}
	for _, conc := range []int{32, 16} {
		if d, ok := cell(r.Hit, "direct", conc); ok {
			p, _ := cell(r.Hit, "llm-dedupe-proxy (", conc)
			n, okn := cell(r.Hit, "nginx", conc)
			w("| hit throughput, %d clients | %.0f req/s (upstream at 0 ms) | %.0f req/s | %s |\n", conc, d.RPS, p.RPS, ifOK(okn, fmt.Sprintf("%.0f req/s", n.RPS)))
		}
	}
	for _, set := range []struct {
		name  string
		cells []lagCell
	}{{"duplicate's completion lag", r.Lag}, {"duplicate's first-chunk lag (stream)", r.Stream}} {
		for _, where := range []string{"same instance", "other instance"} {
			var ours, theirs *lagCell
			for i := range set.cells {
				c := &set.cells[i]
				if c.Where == where && c.System == "nginx" {
					theirs = c
				} else if c.Where == where {
					ours = c
				}
			}
			if ours == nil {
				continue
			}
			t := "–"
			if theirs != nil {
				t = pp(theirs.P50, theirs.P99) + fmt.Sprintf(" (%s upstream calls per %d requests)", f2(theirs.CallsPerTrial), 1+r.Config["lag_followers"].(int))
			}
			w("| %s, %s | – | %s (%s upstream calls per %d requests) | %s |\n", set.name, where, pp(ours.P50, ours.P99), f2(ours.CallsPerTrial), 1+r.Config["lag_followers"].(int), t)
		}
	}
	for _, stream := range []bool{false, true} {
		for _, inst := range []int{1, 3} {
			var ours, theirs *dupCell
			for i := range r.Dup {
				c := &r.Dup[i]
				if c.Stream == stream && c.Instances == inst && c.N == 100 {
					if c.System == "nginx" {
						theirs = c
					} else {
						ours = c
					}
				}
			}
			if ours == nil {
				continue
			}
			kind := "unary"
			if stream {
				kind = "streamed"
			}
			t := "–"
			if theirs != nil {
				t = fmt.Sprintf("%s (p99 %s ms)", f2(theirs.Calls), f2(theirs.P99))
			}
			w("| upstream calls for 100 identical %s requests at once, %d instance(s) | 100 | %s (p99 %s ms) | %s |\n", kind, inst, f2(ours.Calls), f2(ours.P99), t)
		}
	}
	w("\n")
}

func ifOK(ok bool, s string) string {
	if !ok {
		return "–"
	}
	return s
}

func latencyTable(b *strings.Builder, cells []latencyCell, base string) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("| target | clients | p50 | p99 | added p50 | added p99 | p50 ratio | req/s | p50 of each run | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range cells {
		d, _ := cell(cells, base, c.Conc)
		var runs []string
		for _, r := range c.Runs {
			runs = append(runs, f2(r.Summary.P50))
		}
		added50, added99, ratio := "–", "–", "–"
		if !strings.HasPrefix(c.Target, base) {
			added50, added99, ratio = f2(c.P50-d.P50)+" ms", f2(c.P99-d.P99)+" ms", fmt.Sprintf("%.3f", c.P50/d.P50)
		}
		w("| %s | %d | %s ms | %s ms | %s | %s | %s | %.0f | %s | %d |\n", c.Target, c.Conc, f2(c.P50), f2(c.P99), added50, added99, ratio, c.RPS, strings.Join(runs, ", "), c.Errors)
	}
	w("\n")
}

func ownerSection(b *strings.Builder, r *results) {
	if len(r.Owner) == 0 {
		return
	}
	fmt.Fprintf(b, "## Owner path: a request nobody shares\n\nEvery request has a new prompt, so the proxy looks it up in Redis, claims it, calls the upstream (50 ms) and stores the answer; nginx misses its cache and stores the answer. Closed loop: each client sends its next request when its last one ends; %v s warm-up, then %v s measured, per run and target (one client: the targets interleaved request by request, for as long as all of them).\n\n", r.Config["warm_s"], r.Config["measure_s"])
	latencyTable(b, r.Owner, "direct")
}

func hitSection(b *strings.Builder, r *results) {
	if len(r.Hit) == 0 {
		return
	}
	fmt.Fprintf(b, "## Hit path: a stored answer\n\n64 prompts are answered once, then asked again and again. The baseline is the fake upstream answering at once (0 ms): the cost of the HTTP round trip alone.\n\n")
	latencyTable(b, r.Hit, "direct")
}

func traceSection(b *strings.Builder, r *results) {
	t := r.Trace
	if t == nil || len(t.Hit) == 0 {
		return
	}
	fmt.Fprintf(b, "## Tracing\n\nOne more instance traces every request (`OTEL_TRACES_SAMPLER=always_on`, OTLP/HTTP to a sink on loopback that drops what it gets), beside proxy-1, which does not: the same stored answers, then unique prompts (upstream 50 ms, one client). The sink got %d spans in %d exports (%.1f MiB) for the %d requests the traced instance served: the batch processor drops spans its queue cannot hold.\n\n", t.Spans, t.Exports, float64(t.ExportBytes)/(1<<20), t.Requests)
	latencyTable(b, t.Hit, "tracing off")
	latencyTable(b, t.Owner, "tracing off")
	if offs, ons := t.CPUPerHit["tracing off (hit)"], t.CPUPerHit["tracing on, all sampled (hit)"]; len(offs) > 0 && len(ons) > 0 {
		fmt.Fprintf(b, "The instance's CPU time per hit (%d clients, a run each, alternating): %s µs with tracing off, %s µs on; off ÷ on %.2f, the throughput ratio where the instance has its CPUs to itself.\n\n",
			t.Hit[len(t.Hit)-1].Conc, f2(median(offs)), f2(median(ons)), median(offs)/median(ons))
	}
	for _, off := range t.Hit {
		on, ok := cell(t.Hit, "tracing on", off.Conc)
		if strings.HasPrefix(off.Target, "tracing off") && ok && off.RPS > 0 {
			fmt.Fprintf(b, "Hits with %d clients: tracing on serves %.2f× the requests per second of tracing off.\n\n", off.Conc, on.RPS/off.RPS)
		}
	}
}

func lagSection(b *strings.Builder, title, how string, cells []lagCell) {
	if len(cells) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## %s\n\n%s Upstream calls per trial counts the first request and its duplicates together (1 is ideal).\n\n", title, how)
	w("| system | duplicate lands on | lag p50 | lag p99 | completion lag p50 / p99 | upstream calls per trial | duplicates' roles | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range cells {
		w("| %s | %s | %s ms | %s ms | %s | %s | %s | %d |\n", c.System, c.Where, f2(c.P50), f2(c.P99), pp(c.EndP50, c.EndP99), f2(c.CallsPerTrial), roles(c.Roles), c.Errors+c.OwnerNotFirst)
	}
	w("\n")
}

func roles(m map[string]int) string {
	var parts []string
	for _, k := range []string{"owner", "follower", "hit", "bypass", "MISS", "HIT", "EXPIRED", "STALE", "UPDATING", "BYPASS", ""} {
		if v := m[k]; v > 0 {
			name := k
			if name == "" {
				name = "(none)"
			}
			parts = append(parts, fmt.Sprintf("%s %d", name, v))
		}
	}
	return strings.Join(parts, ", ")
}

func dupSection(b *strings.Builder, r *results) {
	if len(r.Dup) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Upstream calls with N identical requests at once\n\n%v distinct prompts × N copies are released together (a barrier), round-robin over the instances, connections opened beforehand. The upstream takes 300 ms (unary) or sends 12 events 25 ms apart (stream: 10 content chunks, the finish chunk and `[DONE]`), so every copy arrives while the first is in flight. The goal is 1 call per distinct prompt.\n\n", r.Config["dup_keys"])
	w("| system | answer | N | instances | upstream calls per distinct prompt (median, max over runs) | latency p50 / p99 | roles | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range r.Dup {
		kind := "unary"
		if c.Stream {
			kind = "stream"
		}
		w("| %s | %s | %d | %d | %s (max %s) | %s | %s | %d |\n", c.System, kind, c.N, c.Instances, f2(c.Calls), f2(c.MaxCalls), pp(c.P50, c.P99), roles(c.Roles), c.Errors)
	}
	w("\n")
}

func redisSection(b *strings.Builder, r *results) {
	if len(r.Redis) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Redis commands per request\n\nThe same workload once to warm the connection pools, `CONFIG RESETSTAT`, %v requests (or owner+follower pairs) of one kind 8 at a time, `INFO commandstats`. Round trips are the commands the proxies sent; Redis also counts the commands its scripts ran, shown apart. Follower rows are owner+follower pairs minus the owner's own cost. A call that lasts longer than 1 s adds one lease renewal (`EVALSHA`) per second to the owner.\n\n", r.Config["redis_requests"])
	w("| path | round trips per request | of which | commands run inside scripts |\n| --- | --- | --- | --- |\n")
	for _, row := range r.Redis {
		w("| %s | %s | %s | %s |\n", row.Path, f2(row.RoundTrips), breakdown(row.Sent), f2(row.InScripts))
	}
	w("\n")
}

func rssSection(b *strings.Builder, r *results) {
	if len(r.RSS) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Memory per waiting request\n\nA fresh proxy instance, warmed with 50 requests, then N client requests (each on its own connection) wait for upstream calls that are held until the measurement is taken. RSS per waiting request = (RSS while they wait − RSS before) / N. \"Another instance\" is an owner process of the harness's own (the bench binary run again, not the load generator): a single-flight group on go-redis's default pool that owns the calls and holds them until the release, so the measured instance follows them through Redis (one subscription per prompt on the instance's pub/sub connection); the Redis commands while waiting include its lease renewals, and release → last answer includes its final writes: the note says when the last one was done and, for each followed answer, how long after its own owner's final write it reached the client (the measured instance's share), and the commands clients sent Redis during the release. Redis clients: Redis's own count, which includes the harness and the idle instances of the other measurements, then the connections of the measured instance and of the owner process.\n\n")
	w("| waiting requests | case | RSS before → while waiting | per waiting request | goroutines | open fds | Redis clients (blocked): all; this instance; owner process | Redis commands/s while waiting | release → last answer | answered 200 | roles | note |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, row := range r.RSS {
		gor, redisCol, cmds := "–", "–", "–"
		if row.Case != rssDirect {
			gor, redisCol, cmds = fmt.Sprintf("%.0f", row.Goroutines), fmt.Sprintf("%d (%d); %d", row.RedisClients, row.RedisBlocked, row.RedisConns), wholeCounts(row.WaitCmds)
			if row.Case == rssRemoteKeys {
				redisCol += fmt.Sprintf("; %d", row.OwnerRedisConns)
			}
		}
		w("| %d | %s | %.0f → %.0f MiB | %.1f KiB | %s | %d | %s | %s | %s s | %d of %d | %s | %s |\n", row.N, row.Case, float64(row.BaseRSS)/(1<<20), float64(row.RSS)/(1<<20),
			row.PerRequest/1024, gor, row.FDs, redisCol, cmds, f2(row.ReleaseSeconds), row.OK, row.N, roles(row.Roles), strings.TrimSpace(row.Note))
	}
	w("\n")
}

func profileSection(b *strings.Builder, r *results) {
	if len(r.Profiles) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Where the proxy's CPU goes\n\nThe proxy binary itself (Redis backend), built with `-tags pprof` so that it serves net/http/pprof on a side port; %v clients, the upstream answering at once so that the proxy's own work is all there is, a CPU profile of the proxy process alone while the load runs. Shares are cumulative (a function and everything it calls) as `go tool pprof -top -cum` reports them, so rows overlap (the HTTP server row contains most of the others, the Redis row contains the script rows); a row starting with … is part of the row above. Profiles: `%s`.\n\n", r.Config["concurrency"], filepath.Dir(r.Profiles[0].File))
	w("| | ")
	for _, p := range r.Profiles {
		w("%s path | ", p.Workload)
	}
	w("\n| --- |%s\n| requests/s while profiled | ", strings.Repeat(" --- |", len(r.Profiles)))
	for _, p := range r.Profiles {
		w("%.0f | ", p.RPS)
	}
	w("\n| proxy CPU per request | ")
	for _, p := range r.Profiles {
		w("%.0f µs | ", p.CPUPerRequest)
	}
	w("\n")
	for _, bk := range profileBuckets {
		w("| %s | ", bk.label)
		for _, p := range r.Profiles {
			w("%.1f %% | ", p.Buckets[bk.label])
		}
		w("\n")
	}
	w("\n")
	for _, p := range r.Profiles {
		w("<details><summary>%s path: go tool pprof -top (flat), CPU and bytes allocated</summary>\n\n```\n      flat  flat%%   sum%%        cum   cum%%\n%s\n```\n\n```\n      flat  flat%%   sum%%        cum   cum%%\n%s\n```\n</details>\n\n",
			p.Workload, strings.Join(head(p.Top, 15), "\n"), strings.Join(head(p.Allocs, 12), "\n"))
	}
}

func head(s []string, n int) []string { return s[:min(n, len(s))] }

// wholeCounts formats command counts (or rates per second) as whole numbers, largest first.
func wholeCounts(m map[string]float64) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for _, p := range strings.Split(breakdown(m), ", ") {
		if i := strings.LastIndexByte(p, ' '); i > 0 {
			v, _ := strconv.ParseFloat(p[i+1:], 64)
			p = fmt.Sprintf("%s %.0f", p[:i], v)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}
