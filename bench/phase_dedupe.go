package main

import (
	"context"
	"fmt"
	"time"
)

// dupCell is upstream calls per distinct request when N identical requests arrive at
// once, spread round-robin over the instances.
type dupCell struct {
	System    string         `json:"system"`
	Stream    bool           `json:"stream"`
	N         int            `json:"duplicates"`
	Instances int            `json:"instances"`
	Calls     float64        `json:"calls_per_distinct"` // median over runs
	MaxCalls  float64        `json:"max_calls_per_distinct"`
	P50       float64        `json:"p50_ms"` // latency of every request of the burst
	P99       float64        `json:"p99_ms"`
	Errors    int            `json:"errors"`
	Roles     map[string]int `json:"roles"`
	CallsRuns []float64      `json:"calls_runs"`
	Runs      []summary      `json:"runs"`
}

// duplicates fires c.dupKeys distinct prompts × N copies in one burst. The upstream takes
// 300ms (unary) or 12 events 25ms apart (10 content chunks, the finish event and [DONE]:
// 300ms), so every copy arrives while its first is in flight. 300ms, not a multiple of
// 500ms, keeps nginx's lock polling (every 500ms) from lining up with the end of the call.
// Connections are opened before the burst.
func (e *env) duplicates(ctx context.Context, c cfg) ([]dupCell, error) {
	type sys struct {
		name  string
		bases []string
	}
	systems := []sys{{"llm-dedupe-proxy", e.proxy}}
	if len(e.nginx) > 0 {
		systems = append(systems, sys{"nginx", e.nginx})
	}
	var out []dupCell
	for _, stream := range []bool{false, true} {
		b := behavior{Delay: 300 * time.Millisecond}
		if stream {
			b = behavior{Delay: 25 * time.Millisecond, Chunks: 10}
		}
		if err := e.setFake(ctx, b); err != nil {
			return nil, err
		}
		for _, n := range c.dupN {
			for _, inst := range []int{1, 3} {
				for _, s := range systems {
					cell := dupCell{System: s.name, Stream: stream, N: n, Instances: inst, Roles: map[string]int{}}
					urls := chatURLs(s.bases[:inst])
					for run := range c.runs {
						for _, b := range s.bases[:inst] {
							e.c.warmConns(ctx, b, "/healthz", n*c.dupKeys/inst+8)
						}
						bodies := make([][]byte, 0, n*c.dupKeys)
						for range n {
							for k := range c.dupKeys {
								bodies = append(bodies, chatBody(fmt.Sprintf("%s dup %s n%d i%d s%v r%d #%d", e.runID, s.name, n, inst, stream, run, k), stream))
							}
						}
						before, err := e.fakeCalls(ctx)
						if err != nil {
							return nil, err
						}
						replies := e.c.burst(ctx, urls, bodies)
						after, err := e.fakeCalls(ctx)
						if err != nil {
							return nil, err
						}
						var lat []time.Duration
						for _, r := range replies {
							if !r.ok() {
								cell.Errors++
								continue
							}
							lat = append(lat, r.latency())
							cell.Roles[r.role]++
						}
						calls := float64(after-before) / float64(c.dupKeys)
						sum := summarize(lat)
						cell.CallsRuns, cell.Runs = append(cell.CallsRuns, calls), append(cell.Runs, sum)
						logf("  %-16s stream=%-5v N=%-3d instances=%d run %d: %.2f upstream calls per distinct request, p99 %.0fms, %d errors",
							s.name, stream, n, inst, run+1, calls, sum.P99, cell.Errors)
					}
					cell.Calls = median(cell.CallsRuns)
					for _, v := range cell.CallsRuns {
						cell.MaxCalls = max(cell.MaxCalls, v)
					}
					cell.P50 = median(runsOf(cell.Runs, func(x summary) float64 { return x.P50 }))
					cell.P99 = median(runsOf(cell.Runs, func(x summary) float64 { return x.P99 }))
					out = append(out, cell)
				}
			}
		}
	}
	return out, nil
}
