package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// traceCells is what tracing costs: the hit and owner paths of an instance that traces
// every request (always_on, exported over OTLP/HTTP to a sink on loopback) beside one that
// does not, in the same run. See ADR 0061.
type traceCells struct {
	Hit   []latencyCell `json:"hit"`
	Owner []latencyCell `json:"owner"`
	// CPUPerHit is each instance's CPU time per hit, µs (a run each, alternating): what
	// bounds its throughput where it does not share its CPUs with the load generator.
	CPUPerHit   map[string][]float64 `json:"cpu_per_hit_us"`
	ExportBytes int64                `json:"export_bytes"`
	Exports     int64                `json:"exports"`
	// Spans is how many spans the sink got, Requests how many requests the traced instance
	// served: the batch processor drops spans when its queue is full.
	Spans    int64 `json:"spans"`
	Requests int64 `json:"requests"`
}

// otlpSink takes OTLP/HTTP trace exports and drops them, counting what came.
type otlpSink struct {
	srv                   *http.Server
	url                   string
	bytes, exports, spans atomic.Int64
}

func startSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.bytes.Add(int64(len(b)))
		s.exports.Add(1)
		var req coltracepb.ExportTraceServiceRequest
		if proto.Unmarshal(b, &req) == nil {
			for _, rs := range req.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					s.spans.Add(int64(len(ss.Spans)))
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (e *env) tracingCost(ctx context.Context, c cfg) (*traceCells, error) {
	sink, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sink.srv.Close()
	tracedProc, traced, err := startProxy(ctx, &e.ps, e.dir, e.proxyBin, "proxy-traced", e.fakeURL, e.redisAddr(),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+sink.url, "OTEL_TRACES_SAMPLER=always_on", "OTEL_SERVICE_NAME=bench")
	if err != nil {
		return nil, err
	}
	out := &traceCells{}
	if err := e.setFake(ctx, behavior{}); err != nil {
		return nil, err
	}
	const hitKeys = 64
	bodies := make([][]byte, hitKeys)
	for i := range bodies {
		bodies[i] = chatBody(fmt.Sprintf("%s traced hit #%d", e.runID, i), false)
	}
	targets := []target{{"tracing off (hit)", chatURL(e.proxy[0])}, {"tracing on, all sampled (hit)", chatURL(traced)}}
	if err := e.store(ctx, targets, bodies); err != nil {
		return nil, err
	}
	for _, conc := range c.hitConc {
		out.Hit = append(out.Hit, e.measureLatency(ctx, c, targets, conc, func(t target, run int) func(int64) []byte {
			return func(i int64) []byte { return bodies[i%hitKeys] }
		})...)
	}
	out.CPUPerHit = map[string][]float64{}
	pids := []int{e.proxies[0].cmd.Process.Pid, tracedProc.cmd.Process.Pid}
	for run := range c.runs {
		for j := range targets {
			i := (j + run) % len(targets)
			before, err := cpuTime(pids[i])
			if err != nil {
				return nil, err
			}
			r := e.c.closedLoop(ctx, targets[i].url, slices.Max(c.hitConc), 0, c.dur, func(n int64) []byte { return bodies[n%hitKeys] })
			after, err := cpuTime(pids[i])
			if err != nil || r.Completed == 0 {
				return nil, fmt.Errorf("cpu per hit of %s: %v, %d completed", targets[i].name, err, r.Completed)
			}
			us := float64((after - before).Microseconds()) / float64(r.Completed)
			out.CPUPerHit[targets[i].name] = append(out.CPUPerHit[targets[i].name], us)
			logf("  %-36s cpu per hit %.1f µs (%d hits)", targets[i].name, us, r.Completed)
		}
	}
	if err := e.setFake(ctx, behavior{Delay: 50 * time.Millisecond}); err != nil {
		return nil, err
	}
	owners := []target{{"tracing off (owner)", chatURL(e.proxy[0])}, {"tracing on, all sampled (owner)", chatURL(traced)}}
	out.Owner = e.measureLatency(ctx, c, owners, 1, func(t target, run int) func(int64) []byte {
		return func(i int64) []byte {
			return chatBody(fmt.Sprintf("%s traced owner %s r%d #%d", e.runID, t.name, run, i), false)
		}
	})
	served, err := e.metric(ctx, traced, "llm_dedupe_requests_total")
	if err != nil {
		return nil, err
	}
	out.Requests = int64(served)
	out.ExportBytes, out.Exports, out.Spans = sink.bytes.Load(), sink.exports.Load(), sink.spans.Load()
	return out, nil
}
