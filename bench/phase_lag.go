package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
)

// lagSpec is one follower-lag configuration: where the owner's request goes, where its
// duplicates go, and whether the answer is streamed.
type lagSpec struct {
	Name     string `json:"name"`
	System   string `json:"system"`
	Where    string `json:"where"` // same or other instance
	Stream   bool   `json:"stream"`
	owner    string
	follower string
}

// lagCell is what the trials of one spec found. For a unary answer the lag is the time
// from the owner's client receiving its last byte to a follower's client receiving its
// last byte; for a stream, from the owner's first byte (first chunk) to a follower's.
type lagCell struct {
	lagSpec
	P50           float64        `json:"p50_ms"`
	P99           float64        `json:"p99_ms"`
	EndP50        float64        `json:"end_p50_ms"` // streams: completion lag too
	EndP99        float64        `json:"end_p99_ms"`
	CallsPerTrial float64        `json:"upstream_calls_per_trial"` // median over runs
	Roles         map[string]int `json:"follower_roles"`
	Errors        int            `json:"errors"`
	OwnerNotFirst int            `json:"owner_not_first"`
	Runs          []summary      `json:"runs"`
	EndRuns       []summary      `json:"end_runs"`
	Calls         []float64      `json:"calls_per_trial_runs"`
	Samples       [][]float64    `json:"samples_ms"`
}

// lags measures each spec over c.runs runs of c.lagTrials trials. A trial sends one
// request, waits offset (the owner's call is under way), then sends c.lagFollowers
// duplicates at once. Trials run a few at a time, each with its own prompt.
func (e *env) lags(ctx context.Context, c cfg, specs []lagSpec, offset time.Duration) ([]lagCell, error) {
	cells := make([]lagCell, len(specs))
	for i, s := range specs {
		cells[i] = lagCell{lagSpec: s, Roles: map[string]int{}}
	}
	for run := range c.runs {
		for j := range specs {
			i := (j + run) % len(specs)
			s, cell := specs[i], &cells[i]
			e.c.warmConns(ctx, baseOf(s.owner), "/healthz", 16)
			e.c.warmConns(ctx, baseOf(s.follower), "/healthz", 64)
			before, err := e.fakeCalls(ctx)
			if err != nil {
				return nil, err
			}
			var (
				mu         sync.Mutex
				lag, endLg []time.Duration
				wg         sync.WaitGroup
				sem        = make(chan struct{}, 8)
			)
			for t := range c.lagTrials {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					body := chatBody(fmt.Sprintf("%s lag %s r%d #%d", e.runID, s.Name, run, t), s.Stream)
					o, fs := e.trial(ctx, s, body, c.lagFollowers, offset)
					mu.Lock()
					defer mu.Unlock()
					if !o.ok() {
						fmt.Fprintf(os.Stderr, "bench:   %s: the first request failed: status %d, %v, %.200q\n", s.Name, o.status, o.err, o.body)
						cell.Errors++
						return
					}
					if o.role != "owner" && o.role != "MISS" {
						cell.OwnerNotFirst++
						return
					}
					for _, f := range fs {
						if !f.ok() {
							fmt.Fprintf(os.Stderr, "bench:   %s: a duplicate failed: status %d, %v, %.200q\n", s.Name, f.status, f.err, f.body)
							cell.Errors++
							continue
						}
						cell.Roles[f.role]++
						if s.Stream {
							lag = append(lag, f.first.Sub(o.first))
						} else {
							lag = append(lag, f.end.Sub(o.end))
						}
						endLg = append(endLg, f.end.Sub(o.end))
					}
				})
			}
			wg.Wait()
			after, err := e.fakeCalls(ctx)
			if err != nil {
				return nil, err
			}
			calls := float64(after-before) / float64(c.lagTrials)
			sum, endSum := summarize(lag), summarize(endLg)
			cell.Runs, cell.EndRuns = append(cell.Runs, sum), append(cell.EndRuns, endSum)
			cell.Calls = append(cell.Calls, calls)
			cell.Samples = append(cell.Samples, msSamples(lag))
			logf("  %-40s run %d: lag p50 %.2fms p99 %.2fms; %.2f upstream calls per trial", s.Name, run+1, sum.P50, sum.P99, calls)
		}
	}
	for i := range cells {
		c := &cells[i]
		c.P50 = median(runsOf(c.Runs, func(x summary) float64 { return x.P50 }))
		c.P99 = median(runsOf(c.Runs, func(x summary) float64 { return x.P99 }))
		c.EndP50 = median(runsOf(c.EndRuns, func(x summary) float64 { return x.P50 }))
		c.EndP99 = median(runsOf(c.EndRuns, func(x summary) float64 { return x.P99 }))
		c.CallsPerTrial = median(c.Calls)
	}
	return cells, nil
}

// trial sends the owner's request, then after offset n duplicates to the follower URL.
func (e *env) trial(ctx context.Context, s lagSpec, body []byte, n int, offset time.Duration) (reply, []reply) {
	var owner reply
	done := make(chan struct{})
	go func() { owner = e.c.post(ctx, s.owner, body, false); close(done) }()
	time.Sleep(offset)
	fs := make([]reply, n)
	var wg sync.WaitGroup
	for i := range fs {
		wg.Go(func() { fs[i] = e.c.post(ctx, s.follower, body, false) })
	}
	wg.Wait()
	<-done
	return owner, fs
}

// lagSpecs are the four places a duplicate can land: the owner's instance or another
// one, of the proxy and of nginx.
func (e *env) lagSpecs(stream bool) []lagSpec {
	kind := "unary"
	if stream {
		kind = "stream"
	}
	specs := []lagSpec{
		{Name: "llm-dedupe-proxy same instance " + kind, System: "llm-dedupe-proxy", Where: "same instance", Stream: stream, owner: chatURL(e.proxy[0]), follower: chatURL(e.proxy[0])},
		{Name: "llm-dedupe-proxy other instance " + kind, System: "llm-dedupe-proxy", Where: "other instance", Stream: stream, owner: chatURL(e.proxy[0]), follower: chatURL(e.proxy[1])},
	}
	if len(e.nginx) > 0 {
		specs = append(specs,
			lagSpec{Name: "nginx same instance " + kind, System: "nginx", Where: "same instance", Stream: stream, owner: chatURL(e.nginx[0]), follower: chatURL(e.nginx[0])},
			lagSpec{Name: "nginx other instance " + kind, System: "nginx", Where: "other instance", Stream: stream, owner: chatURL(e.nginx[0]), follower: chatURL(e.nginx[1])})
	}
	return specs
}

func baseOf(url string) string { return url[:len(url)-len("/v1/chat/completions")] }
