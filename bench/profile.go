package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// profileRow is one CPU profile of the proxy under one workload.
type profileRow struct {
	Workload string   `json:"workload"`
	RPS      float64  `json:"rps"`
	File     string   `json:"file"`
	Top      []string `json:"top"` // go tool pprof -top lines, flat
	// Allocs is the -top of the bytes allocated in the same window, by allocating function.
	Allocs []string `json:"allocs_top"`
	// CPUPerRequest is the proxy's CPU time per request in microseconds: the profile's
	// samples over the requests answered while it ran.
	CPUPerRequest float64 `json:"cpu_us_per_request"`
	// Buckets are the cumulative shares (%) of the profile in profileBuckets.
	Buckets map[string]float64 `json:"buckets"`
}

// profileBuckets name where a request's CPU goes: each is the sum of the cumulative
// share of the functions its pattern matches (chosen so that none calls another).
var profileBuckets = []struct{ label, re string }{
	{"HTTP server: read request, handler, write answer (net/http.(*conn).serve)", `^net/http\.\(\*conn\)\.serve$`},
	{"request key (hashing.(*Hasher).KeyIn)", `hashing\.\(\*Hasher\)\.KeyIn$`},
	{"Redis round trips, every script (go-redis (*Script).Run, (*Pipeline).Exec)", `go-redis/v9\.\((\*Script\)\.Run|\*Pipeline\)\.Exec)$`},
	{"lookup: script and decoding its answer (singleflight.(*remote).lookup)", `singleflight\.\(\*remote\)\.lookup$`},
	{"… decoding a hit's stored header (singleflight.decodeHead)", `singleflight\.decodeHead$`},
	{"INCR owner-seq (singleflight.(*remote).newToken)", `singleflight\.\(\*remote\)\.newToken$`},
	{"claim (singleflight.(*remote).claim)", `singleflight\.\(\*remote\)\.claim$`},
	{"complete (singleflight.(*remoteOwnership).complete)", `singleflight\.\(\*remoteOwnership\)\.complete$`},
	{"upstream call (proxy ownerFunc; net/http's connection loops, where used)", `(proxy\.\(\*Proxy\)\.ownerFunc\.func1|net/http\.\(\*persistConn\)\.(readLoop|writeLoop))$`},
	{"JSON decoding, all (encoding/json.Unmarshal)", `^encoding/json\.Unmarshal$`},
	{"… usage for the saved-tokens metric (proxy.(*tail).usage)", `proxy\.\(\*tail\)\.usage$`},
	{"JSON encoding, all (encoding/json.Marshal)", `^encoding/json\.Marshal$`},
	{"metrics (metrics.(*Metrics) methods)", `/metrics\.\(\*Metrics\)\.(Request|Upstream|Saved|WaitingAdd|Observe)$`},
	{"memory allocation (runtime.mallocgc)", `^runtime\.mallocgc$`},
	{"garbage collection (runtime.gcBgMarkWorker)", `^runtime\.gcBgMarkWorker$`},
	{"system calls, flat (Syscall6)", `^internal/runtime/syscall/linux\.Syscall6$`},
}

// profiles runs a proxy that serves pprof and takes a CPU profile of it while the load generator
// sends unique prompts (owner path) and then stored prompts (hit path), the upstream
// answering at once so that the proxy's own work is all there is to see.
func (e *env) profiles(ctx context.Context, c cfg, outDir string) ([]profileRow, error) {
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	p, base, err := startProxy(ctx, &e.ps, e.dir, e.proxyBin, "proxy-pprof", e.fakeURL, e.redisAddr(),
		"LLM_DEDUPE_PPROF_LISTEN="+loopback(pport))
	if err != nil {
		return nil, err
	}
	defer e.ps.remove(p)
	if err := e.setFake(ctx, behavior{}); err != nil {
		return nil, err
	}
	const hitKeys = 64
	for i := range hitKeys {
		e.c.post(ctx, chatURL(base), chatBody(fmt.Sprintf("%s pprof hit #%d", e.runID, i), false), false)
	}
	workloads := []struct {
		name string
		body func(int64) []byte
	}{
		{"owner", func(i int64) []byte { return chatBody(fmt.Sprintf("%s pprof owner #%d", e.runID, i), false) }},
		{"hit", func(i int64) []byte { return chatBody(fmt.Sprintf("%s pprof hit #%d", e.runID, i%hitKeys), false) }},
	}
	var rows []profileRow
	for _, w := range workloads {
		file := filepath.Join(outDir, "cpu-"+w.name+".pprof")
		allocFile := filepath.Join(outDir, "allocs-"+w.name+".pprof")
		profErr := make(chan error, 2)
		secs := int(c.profileDur.Seconds())
		go func() {
			time.Sleep(c.warm)
			profErr <- e.fetchProfile(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", loopback(pport), secs), file)
		}()
		go func() { // the allocations of the same window (a delta profile)
			time.Sleep(c.warm)
			profErr <- e.fetchProfile(ctx, fmt.Sprintf("http://%s/debug/pprof/allocs?seconds=%d", loopback(pport), secs), allocFile)
		}()
		r := e.c.closedLoop(ctx, chatURL(base), c.conc, c.warm, c.profileDur+500*time.Millisecond, w.body)
		if err := errors.Join(<-profErr, <-profErr); err != nil {
			return nil, err
		}
		row := profileRow{Workload: w.name, RPS: r.RPS, File: file}
		top, _, err := pprofTop(ctx, file, false, 15)
		if err != nil {
			return nil, err
		}
		cum, total, err := pprofTop(ctx, file, true, 100000)
		if err != nil {
			return nil, err
		}
		row.Top = top
		if row.Allocs, _, err = pprofTop(ctx, allocFile, false, 12, "-sample_index=alloc_space"); err != nil {
			return nil, err
		}
		row.Buckets = buckets(cum)
		row.CPUPerRequest = total.Seconds() * 1e6 / (r.RPS * float64(secs))
		logf("  %s path: %.0f req/s (%d errors, roles %v); profile in %s", w.name, r.RPS, r.Errors, r.Roles, file)
		rows = append(rows, row)
	}
	return rows, nil
}

func (e *env) fetchProfile(ctx context.Context, url, file string) error {
	b, err := e.c.get(ctx, url)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// pprofTop is go tool pprof's -top report of a profile: its function lines, and the
// total of its samples.
func pprofTop(ctx context.Context, file string, cum bool, n int, extra ...string) ([]string, time.Duration, error) {
	args := append([]string{"tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", n), "-nodefraction=0", "-edgefraction=0"}, extra...)
	if cum {
		args = append(args, "-cum")
	}
	out, err := exec.CommandContext(ctx, "go", append(args, file)...).Output()
	if err != nil {
		return nil, 0, fmt.Errorf("go tool pprof: %w", err)
	}
	var (
		lines   []string
		total   time.Duration
		started bool
	)
	for _, l := range strings.Split(string(out), "\n") {
		if _, rest, ok := strings.Cut(l, "Total samples = "); ok {
			total, _ = time.ParseDuration(strings.Fields(rest)[0])
		}
		if strings.HasPrefix(strings.TrimSpace(l), "flat") {
			started = true
			continue
		}
		if started && strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimRight(l, " "))
		}
	}
	return lines, total, nil
}

// buckets sums, for each of profileBuckets, the cum% of the -top -cum lines it matches;
// "system calls, flat" takes flat%.
func buckets(lines []string) map[string]float64 {
	out := map[string]float64{}
	for _, b := range profileBuckets {
		re := regexp.MustCompile(b.re)
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 6 {
				continue
			}
			name := strings.TrimSuffix(strings.Join(f[5:], " "), " (inline)")
			if !re.MatchString(name) {
				continue
			}
			col := f[4]
			if strings.HasPrefix(b.label, "system calls, flat") {
				col = f[1]
			}
			v, _ := strconv.ParseFloat(strings.TrimSuffix(col, "%"), 64)
			out[b.label] += v
		}
	}
	return out
}
