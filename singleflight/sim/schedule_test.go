package sim

import (
	"fmt"
	"time"
)

// scenario draws from seed a deployment (instances, standalone Redis, a Cluster or none),
// a workload of herds of clients, the upstream's plan for every call, and a schedule of
// faults. It returns the config and what to schedule once the world exists.
func scenario(seed int64) (config, func(*world)) {
	r := newRnd(seed)
	cfg := config{seed: seed, instances: 2 + r.IntN(3)}
	switch x := r.IntN(10); {
	case x < 2:
		cfg.masters = 3
	case x < 3:
		cfg.masters, cfg.instances = -1, 1 // in memory: one instance
	}
	cfg.keys = map[string]keySpec{}
	nkeys := 1 + r.IntN(4)
	for i := range nkeys {
		cfg.keys[fmt.Sprintf("k%d", i+1)] = keySpec{stream: r.IntN(2) == 0}
	}
	cfg.plans = seededPlans(seed, drawPlan)
	if r.IntN(4) == 0 {
		cfg.opts.ResultTTL = -1 // dedupe only
	}
	cfg.latency = time.Duration(1+r.IntN(500)) * time.Microsecond
	return cfg, func(w *world) {
		insts := make([]string, len(w.insts))
		for i, in := range w.insts {
			insts[i] = in.id
		}
		keys := sortedKeys(cfg.keys)
		drawClients(r, w, insts, keys)
		if cfg.masters >= 0 {
			drawFaults(r, w, insts)
		}
	}
}

// drawPlan is how the upstream answers one call.
func drawPlan(r *rnd) plan {
	p := plan{chunks: 1 + r.IntN(8), gap: r.between(10*time.Millisecond, 800*time.Millisecond)}
	switch x := r.IntN(100); {
	case x < 7:
		p.fail = "500"
	case x < 11:
		p.fail = "400"
	case x < 15:
		p.fail = "error"
	case x < 20:
		p.fail = "midway"
	case x < 23:
		p.fail = "hang"
	}
	return p
}

// drawClients asks herds of clients: a few at almost the same time for one key, on any
// instance, some leaving early, some coming back.
func drawClients(r *rnd, w *world, insts, keys []string) {
	herds := 2 + r.IntN(6)
	for range herds {
		at := r.between(0, 20*time.Second)
		key := keys[r.IntN(len(keys))]
		n := 1 + r.IntN(8)
		for range n {
			s := clientSpec{at: at + r.between(0, 300*time.Millisecond), on: insts[r.IntN(len(insts))], key: key,
				leave: 2 * time.Minute} // an SDK's timeout
			switch x := r.IntN(100); {
			case x < 5:
				s.noCache = true
			case x < 10:
				s.noStore = true
			case x < 14:
				s.finish = true
			}
			switch x := r.IntN(100); {
			case x < 15:
				s.leave = r.between(50*time.Millisecond, 5*time.Second)
			case x < 20:
				s.leaveAtFirst = true
			}
			w.ask(s)
			if s.leave < time.Minute && r.IntN(3) == 0 {
				// It comes back: an SDK's retry, within or past the grace.
				back := s
				back.at, back.leave = s.at+s.leave+r.between(0, 3*time.Second), 2*time.Minute
				back.on = insts[r.IntN(len(insts))]
				w.ask(back)
			}
		}
	}
}

// drawFaults schedules up to three faults of Redis or of instances.
func drawFaults(r *rnd, w *world, insts []string) {
	nodes := len(w.nodes)
	for range r.IntN(4) {
		at := r.between(0, 25*time.Second)
		d := r.between(200*time.Millisecond, 8*time.Second)
		inst := insts[r.IntN(len(insts))]
		node := r.IntN(nodes)
		switch r.IntN(11) {
		case 0:
			w.hangRedis(at, d, node)
		case 1:
			w.slowRedis(at, d, r.between(time.Millisecond, 900*time.Millisecond), node)
		case 2:
			w.dropConns(at, node)
		case 3:
			w.restartRedis(at, r.between(100*time.Millisecond, 3*time.Second), at-r.between(0, 5*time.Second), node)
		case 4:
			w.losePublish(at, 1+r.IntN(5), node)
		case 5:
			w.flushScripts(at, node)
		case 6:
			w.partition(at, d, inst)
		case 7:
			w.pause(at, d, inst)
		case 8:
			w.kill(at, inst)
		case 9:
			w.shutdown(at, r.between(0, 5*time.Second), inst)
		case 10:
			w.hangRedis(at, d, -1)
		}
	}
}
