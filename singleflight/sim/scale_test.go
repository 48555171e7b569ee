package sim

import (
	"flag"
	"fmt"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Scale on paper: more instances and herds than one machine runs as processes, to see how
// Redis's cost grows. Each herd is one prompt asked by clients on several instances at
// once; the figures are per request, beside bench -only redis's on real Redis.

// make test runs it at 10 instances and 100 herds; docs/simulator.md has the figures of
// go test ./singleflight/sim -run TestScale -v -args -sim.instances=50 -sim.herds=1000.
var (
	scaleInstances = flag.Int("sim.instances", 10, "instances of TestScale")
	scaleHerds     = flag.Int("sim.herds", 100, "herds of TestScale")
)

func TestScale(t *testing.T) {
	insts, herds := *scaleInstances, *scaleHerds
	const perHerd = 8
	var report string
	synctest.Test(t, func(t *testing.T) {
		keys := map[string]keySpec{}
		for h := range herds {
			keys[fmt.Sprintf("p%d", h)] = keySpec{stream: h%2 == 0}
		}
		w := newWorld(t, config{seed: 42, instances: insts, keys: keys,
			plans: func(string, int) plan { return plan{chunks: 4, gap: 150 * time.Millisecond} }})
		r := newRnd(42)
		for h := range herds {
			at := r.between(0, 20*time.Second)
			for range perHerd {
				w.ask(clientSpec{at: at + r.between(0, 50*time.Millisecond), key: fmt.Sprintf("p%d", h),
					on: w.insts[r.IntN(insts)].id, leave: 2 * time.Minute})
			}
		}
		w.run(w.cfg.opts.Linger)
		for _, v := range w.viol {
			t.Errorf("invariant broken: %s", v)
		}
		report = scaleReport(w, insts, herds*perHerd)
		if calls := len(w.up.snapshot()); calls != herds {
			t.Errorf("%d upstream calls for %d herds; want one each", calls, herds)
		}
	})
	t.Logf("\n%s", report)
}

// scaleReport is what Redis was asked, per request, and the connections the instances made.
func scaleReport(w *world, insts, requests int) string {
	w.stats.mu.Lock()
	defer w.stats.mu.Unlock()
	var b strings.Builder
	roles := map[string]int{}
	for _, c := range w.clients {
		roles[c.role.String()]++
	}
	fmt.Fprintf(&b, "%d instances, %d requests (%v), %d upstream calls\n", insts, requests, roles, len(w.up.snapshot()))
	total := 0
	names := make([]string, 0, len(w.stats.commands))
	for n, c := range w.stats.commands {
		names = append(names, n)
		total += c
	}
	sort.Strings(names)
	fmt.Fprintf(&b, "commands an instance sent, per request: %.2f\n", float64(total)/float64(requests))
	for _, n := range names {
		fmt.Fprintf(&b, "  %-9s %.3f\n", n, float64(w.stats.commands[n])/float64(requests))
	}
	dials := 0
	for _, d := range w.stats.dials {
		dials += d
	}
	fmt.Fprintf(&b, "connections dialled per instance: %.1f (pool and pub/sub, over the run)\n", float64(dials)/float64(insts))
	return b.String()
}
