package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Seeded exploration: a seed draws a deployment, a workload, the upstream's plans and a
// schedule of faults; the run is checked against every invariant. A failing seed prints
// its violations and its timeline, and replays with -sim.seed.

var (
	seeds    = flag.Int("sim.seeds", 64, "seeds TestExplore runs")
	firstArg = flag.Int64("sim.first", 1, "first seed TestExplore runs")
	oneSeed  = flag.Int64("sim.seed", 0, "run this seed alone and print its timeline")
	commands = flag.Bool("sim.commands", false, "with -sim.seed: the timeline shows the Redis commands too")
)

// TestExplore runs -sim.seeds seeds from -sim.first, or -sim.seed alone.
func TestExplore(t *testing.T) {
	first, n := *firstArg, int64(*seeds)
	if *oneSeed != 0 {
		first, n = *oneSeed, 1
	}
	if testing.Short() {
		n = min(n, 16)
	}
	var runs, failed atomic.Int64
	start := time.Now()
	t.Run("seeds", func(t *testing.T) {
		for s := first; s < first+n; s++ {
			t.Run(fmt.Sprint(s), func(t *testing.T) {
				t.Parallel()
				w := explore(t, s, *oneSeed != 0)
				runs.Add(1)
				if len(w.viol) > 0 {
					failed.Add(1)
				}
			})
		}
	})
	t.Logf("%d runs, %d with violations, in %s", runs.Load(), failed.Load(), time.Since(start).Round(time.Millisecond))
}

// explore runs one seed and reports what it broke.
func explore(t *testing.T, seed int64, show bool) *world {
	var w *world
	var progress atomic.Int64
	var hist atomic.Pointer[history]
	stop := watchdog(seed, &progress, &hist)
	defer stop()
	seedGlobal(seed)
	synctest.Test(t, func(t *testing.T) {
		cfg, drive := scenario(seed)
		cfg.progress = &progress
		if show && *commands {
			cfg.verbose = quiet
		}
		w = newWorld(t, cfg)
		hist.Store(w.hist)
		drive(w)
		w.run(w.cfg.opts.Linger + w.cfg.opts.LeaseTTL)
	})
	all := timeline(w.hist.all(), 0, kClient, kCall, kFlight, kRedis, kFault)
	if len(w.viol) > 0 {
		t.Errorf("seed %d broke %d invariants (replay: go test ./singleflight/sim -run 'TestExplore' -sim.seed=%d -v):\n  %s\n%s",
			seed, len(w.viol), seed, strings.Join(w.viol, "\n  "), all)
	} else if show {
		t.Logf("seed %d:\n%s", seed, all)
	}
	return w
}

// watchdog fails loudly when a run makes no progress for a while of real time: a bubble
// whose clock cannot advance because a goroutine waits for a mutex that one waiting for
// the clock holds (see handshake). It prints every goroutine and ends the process.
func watchdog(seed int64, progress *atomic.Int64, hist *atomic.Pointer[history]) (stop func()) {
	done := make(chan struct{})
	go func() {
		last, since := progress.Load(), time.Now()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if p := progress.Load(); p != last {
				last, since = p, time.Now()
				continue
			}
			if time.Since(since) > 20*time.Second {
				buf := make([]byte, 8<<20)
				buf = buf[:runtime.Stack(buf, true)]
				var tail string
				if h := hist.Load(); h != nil {
					ev := h.all()
					tail = timeline(ev[max(0, len(ev)-40):], 0, kClient, kCall, kFlight, kRedis, kFault)
				}
				fmt.Fprintf(os.Stderr, "seed %d: the simulation stalled (no progress for 20s):\n%s\nits last events:\n%s\n", seed, buf, tail)
				os.Exit(3)
			}
		}
	}()
	return func() { close(done) }
}
