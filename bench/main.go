// Command bench measures what llm-dedupe-proxy costs and saves, side by side with calling
// the upstream directly and with nginx's proxy_cache_lock: it starts a fake upstream,
// redis-server, three proxy instances (and one on the in-memory backend) and three nginx
// instances on loopback, drives them from a Go load generator, prints a markdown report and
// writes it to BENCHMARKS.md, with every raw number in bench/results/. For one memory
// measurement it runs itself again as another instance's owners (see ownersEnv).
//
//	go run ./bench           # the full run (make bench), about 7 minutes
//	go run ./bench -quick    # a smoke run of every measurement, under 2 minutes
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// cfg sizes a run.
type cfg struct {
	quick        bool
	runs         int
	warm, dur    time.Duration
	conc         int   // concurrency of the throughput measurements
	ownerConc    []int // concurrencies of the owner-path measurement
	hitConc      []int
	lagTrials    int // per run and configuration
	lagFollowers int // duplicates per trial
	dupN         []int
	dupKeys      int // distinct prompts per burst
	redisN       int
	rssSizes     []int
	profileDur   time.Duration
	keepSamples  bool
}

func fullCfg() cfg {
	return cfg{runs: 3, warm: time.Second, dur: 3 * time.Second, conc: 32, ownerConc: []int{1, 32}, hitConc: []int{1, 32},
		lagTrials: 40, lagFollowers: 4, dupN: []int{10, 100}, dupKeys: 10, redisN: 200,
		rssSizes: []int{1000, 10000}, profileDur: 5 * time.Second, keepSamples: true}
}

func quickCfg() cfg {
	return cfg{quick: true, runs: 1, warm: 300 * time.Millisecond, dur: time.Second, conc: 16, ownerConc: []int{1, 16}, hitConc: []int{1, 16},
		lagTrials: 8, lagFollowers: 2, dupN: []int{10, 100}, dupKeys: 2, redisN: 20,
		rssSizes: []int{1000}, profileDur: 2 * time.Second, keepSamples: true}
}

var phases = []string{"owner", "hit", "trace", "lag", "stream", "dup", "redis", "rss", "pprof"}

func main() {
	runAsOwners() // the owner process of the rss measurement: see ownersEnv
	quick := flag.Bool("quick", false, "smoke run: one short run of every measurement")
	out := flag.String("out", "", "markdown report to write (default BENCHMARKS.md; none with -quick or -only)")
	resultsDir := flag.String("results", filepath.Join("bench", "results"), "directory for the raw numbers (JSON) and CPU profiles")
	runs := flag.Int("runs", 0, "runs of each measurement (default 3, 1 with -quick)")
	only := flag.String("only", "", "comma-separated measurements to run, of "+strings.Join(phases, ","))
	withNginx := flag.Bool("nginx", true, "measure nginx too (needs the nginx binary: bench/ensure-deps.sh)")
	flag.Parse()

	c := fullCfg()
	if *quick {
		c = quickCfg()
	}
	if *runs > 0 {
		c.runs = *runs
	}
	if *out == "" && !*quick && *only == "" {
		*out = "BENCHMARKS.md"
	}
	want := map[string]bool{}
	for _, p := range phases {
		want[p] = *only == ""
	}
	for _, p := range strings.Split(*only, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if !slices.Contains(phases, p) {
				fmt.Fprintf(os.Stderr, "bench: unknown measurement %q (have %s)\n", p, strings.Join(phases, ","))
				os.Exit(2)
			}
			want[p] = true
		}
	}
	if _, err := os.Stat("go.mod"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: run from the repository root (go run ./bench, or make bench)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, want, *withNginx, *out, *resultsDir); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// results is everything one run measured; it is written as JSON, raw samples included.
type results struct {
	Started  time.Time      `json:"started"`
	Seconds  float64        `json:"seconds"`
	Command  string         `json:"command"`
	Machine  machine        `json:"machine"`
	Config   map[string]any `json:"config"`
	Owner    []latencyCell  `json:"owner_path,omitempty"`
	Hit      []latencyCell  `json:"hit_path,omitempty"`
	Trace    *traceCells    `json:"tracing,omitempty"`
	Lag      []lagCell      `json:"follower_lag,omitempty"`
	Stream   []lagCell      `json:"stream_first_chunk_lag,omitempty"`
	Dup      []dupCell      `json:"duplicates,omitempty"`
	Redis    []redisRow     `json:"redis_commands,omitempty"`
	RSS      []rssRow       `json:"rss,omitempty"`
	Profiles []profileRow   `json:"profiles,omitempty"`
	FDLimit  uint64         `json:"fd_limit"`
	Failures []string       `json:"failures,omitempty"`
}

func run(ctx context.Context, c cfg, want map[string]bool, withNginx bool, out, resultsDir string) error {
	started := time.Now()
	load := loadavg()
	res := &results{Started: started, Command: command(), Config: map[string]any{
		"quick": c.quick, "runs": c.runs, "warm_s": c.warm.Seconds(), "measure_s": c.dur.Seconds(), "concurrency": c.conc,
		"lag_trials": c.lagTrials, "lag_followers": c.lagFollowers, "dup_keys": c.dupKeys, "redis_requests": c.redisN,
	}}
	maxN := slices.Max(c.rssSizes)
	res.FDLimit = raiseFileLimit(65536)
	if want["rss"] && res.FDLimit < uint64(maxN)+2048 {
		logf("open-file limit is %d: the RSS measurement keeps at most %d waiting requests", res.FDLimit, res.FDLimit-2048)
		for i, n := range c.rssSizes {
			c.rssSizes[i] = min(n, int(res.FDLimit)-2048)
		}
	}
	if err := os.MkdirAll(resultsDir, 0o755); err != nil {
		return err
	}
	e, err := setup(ctx, withNginx)
	if err != nil {
		return err
	}
	defer e.close()
	res.Machine = describeMachine(ctx, e)
	res.Machine.LoadBefore = load

	step := func(name, what string, f func() error) error {
		if !want[name] || ctx.Err() != nil {
			return ctx.Err()
		}
		logf("%s", what)
		t := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		logf("  (%s took %.0fs)", name, time.Since(t).Seconds())
		return nil
	}
	steps := []struct {
		name, what string
		f          func() error
	}{
		{"owner", "owner path: unique prompts, upstream 50ms", func() (err error) { res.Owner, err = e.ownerOverhead(ctx, c); return }},
		{"hit", "hit path: stored answers", func() (err error) { res.Hit, err = e.hits(ctx, c); return }},
		{"trace", "tracing on (every request sampled) beside tracing off: hit and owner paths", func() (err error) { res.Trace, err = e.tracingCost(ctx, c); return }},
		{"lag", "follower completion lag, unary (upstream 50ms, duplicates 10ms after the first)", func() (err error) {
			if err = e.setFake(ctx, behavior{Delay: 50 * time.Millisecond}); err == nil {
				res.Lag, err = e.lags(ctx, c, e.lagSpecs(false), 10*time.Millisecond)
			}
			return
		}},
		{"stream", "streaming first-chunk lag (10 chunks 20ms apart, duplicates 5ms after the first)", func() (err error) {
			if err = e.setFake(ctx, behavior{Delay: 20 * time.Millisecond, Chunks: 10}); err == nil {
				res.Stream, err = e.lags(ctx, c, e.lagSpecs(true), 5*time.Millisecond)
			}
			return
		}},
		{"dup", "upstream calls per distinct request, N concurrent duplicates", func() (err error) { res.Dup, err = e.duplicates(ctx, c); return }},
		{"redis", "Redis commands per request (INFO commandstats)", func() (err error) { res.Redis, err = e.redisCommands(ctx, c); return }},
		{"rss", "RSS per waiting request", func() (err error) { res.RSS, err = e.rss(ctx, c, res.FDLimit); return }},
		{"pprof", "CPU profiles of the owner and hit paths", func() (err error) { res.Profiles, err = e.profiles(ctx, c, resultsDir); return }},
	}
	// A measurement that fails is reported and the others still run: one flaky step must
	// not throw away ten minutes of numbers.
	for _, s := range steps {
		if err := step(s.name, s.what, s.f); err != nil {
			if ctx.Err() != nil {
				return err
			}
			logf("FAILED: %v", err)
			res.Failures = append(res.Failures, err.Error())
		}
	}
	res.Seconds = time.Since(started).Seconds()
	res.Machine.LoadAfter = loadavg()

	raw := filepath.Join(resultsDir, started.UTC().Format("20060102T150405Z")+".json")
	b, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(raw, b, 0o644); err != nil {
		return err
	}
	md := report(res, raw)
	fmt.Print(md)
	if out != "" {
		if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
			return err
		}
		logf("wrote %s and %s", out, raw)
	} else {
		logf("wrote %s", raw)
	}
	if len(res.Failures) > 0 {
		return fmt.Errorf("%d measurement(s) failed: %s", len(res.Failures), strings.Join(res.Failures, "; "))
	}
	return nil
}

// command is how this run was started, for the report.
func command() string {
	args := strings.Join(os.Args[1:], " ")
	if os.Getenv("MAKELEVEL") != "" && args == "" {
		return "make bench"
	}
	return strings.TrimSpace("go run ./bench " + args)
}
