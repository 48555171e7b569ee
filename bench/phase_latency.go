package main

import (
	"context"
	"fmt"
	"time"
)

// latencyCell is one target at one concurrency: the median over runs of each run's
// percentiles and throughput, with every run kept.
type latencyCell struct {
	Target string         `json:"target"`
	Conc   int            `json:"concurrency"`
	P50    float64        `json:"p50_ms"`
	P99    float64        `json:"p99_ms"`
	RPS    float64        `json:"rps"`
	Errors int            `json:"errors"`
	Roles  map[string]int `json:"roles"`
	Runs   []loadResult   `json:"runs"`
}

type target struct{ name, url string }

// measureLatency runs a closed loop against each target, run after run, rotating the
// order in every run so that no target always goes first (warm caches, a busy machine):
// the baseline is measured in the same run as what is compared with it. With one client
// the targets are interleaved request by request (see interleaved).
func (e *env) measureLatency(ctx context.Context, c cfg, targets []target, conc int, body func(t target, run int) func(int64) []byte) []latencyCell {
	cells := make([]latencyCell, len(targets))
	for i, t := range targets {
		cells[i] = latencyCell{Target: t.name, Conc: conc, Roles: map[string]int{}}
	}
	for run := range c.runs {
		var one []loadResult
		if conc == 1 {
			one = e.c.interleaved(ctx, targets, c.warm, time.Duration(len(targets))*c.dur, run, func(i int) func(int64) []byte { return body(targets[i], run) })
		}
		for j := range targets {
			i := (j + run) % len(targets)
			t := targets[i]
			var r loadResult
			if one != nil {
				r = one[i]
			} else {
				r = e.c.closedLoop(ctx, t.url, conc, c.warm, c.dur, body(t, run))
			}
			if c.keepSamples {
				r.Samples = msSamples(r.Lat)
			}
			cells[i].Runs = append(cells[i].Runs, r)
			cells[i].Errors += r.Errors
			for k, v := range r.Roles {
				cells[i].Roles[k] += v
			}
			logf("  %-36s c=%-3d run %d: p50 %.2fms p99 %.2fms %.0f req/s (%d ok, %d errors)",
				t.name, conc, run+1, r.Summary.P50, r.Summary.P99, r.RPS, r.Completed, r.Errors)
		}
	}
	for i := range cells {
		var s []summary
		var rps []float64
		for _, r := range cells[i].Runs {
			s = append(s, r.Summary)
			rps = append(rps, r.RPS)
		}
		cells[i].P50 = median(runsOf(s, func(x summary) float64 { return x.P50 }))
		cells[i].P99 = median(runsOf(s, func(x summary) float64 { return x.P99 }))
		cells[i].RPS = median(rps)
	}
	return cells
}

// ownerOverhead sends unique prompts (every one a new upstream call) straight to the fake
// upstream, through one proxy instance (owner path: Redis lookup, claim, complete), through
// one on the in-memory backend (the same path without Redis) and through one nginx instance
// (cache miss), with the upstream answering after 50ms.
func (e *env) ownerOverhead(ctx context.Context, c cfg) ([]latencyCell, error) {
	if err := e.setFake(ctx, behavior{Delay: 50 * time.Millisecond}); err != nil {
		return nil, err
	}
	targets := []target{{"direct", chatURL(e.fakeURL)}, {"llm-dedupe-proxy (owner)", chatURL(e.proxy[0])},
		{"llm-dedupe-proxy in-memory (owner)", chatURL(e.memory)}}
	if len(e.nginx) > 0 {
		targets = append(targets, target{"nginx (miss)", chatURL(e.nginx[0])})
	}
	var out []latencyCell
	for _, conc := range c.ownerConc {
		out = append(out, e.measureLatency(ctx, c, targets, conc, func(t target, run int) func(int64) []byte {
			return func(i int64) []byte {
				return chatBody(fmt.Sprintf("%s owner %s c%d r%d #%d", e.runID, t.name, conc, run, i), false)
			}
		})...)
	}
	return out, nil
}

// hits stores hitKeys answers in the proxy and in nginx, then asks for them again and
// again: every request is a hit. The baseline is the fake upstream answering at once.
func (e *env) hits(ctx context.Context, c cfg) ([]latencyCell, error) {
	if err := e.setFake(ctx, behavior{}); err != nil {
		return nil, err
	}
	const hitKeys = 64
	bodies := make([][]byte, hitKeys)
	for i := range bodies {
		bodies[i] = chatBody(fmt.Sprintf("%s hit #%d", e.runID, i), false)
	}
	targets := []target{{"direct (upstream 0 ms)", chatURL(e.fakeURL)}, {"llm-dedupe-proxy (hit)", chatURL(e.proxy[0])}}
	if len(e.nginx) > 0 {
		targets = append(targets, target{"nginx (hit)", chatURL(e.nginx[0])})
	}
	if err := e.store(ctx, targets[1:], bodies); err != nil {
		return nil, err
	}
	var out []latencyCell
	for _, conc := range c.hitConc {
		out = append(out, e.measureLatency(ctx, c, targets, conc, func(t target, run int) func(int64) []byte {
			return func(i int64) []byte { return bodies[i%hitKeys] }
		})...)
	}
	return out, nil
}

// store asks each target for every body once, so that later requests are hits.
func (e *env) store(ctx context.Context, targets []target, bodies [][]byte) error {
	for _, t := range targets {
		for _, b := range bodies {
			if r := e.c.post(ctx, t.url, b, false); !r.ok() {
				return fmt.Errorf("storing a hit through %s: status %d %v", t.name, r.status, r.err)
			}
		}
	}
	return nil
}
