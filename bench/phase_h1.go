package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The h1 measurement compares the two clients an owner can call a plain-HTTP upstream
// with: the proxy's own HTTP/1.1 client (h1Transport, the default) and net/http's
// Transport, which the harness gets by building the proxy with the tag nethttpowners. N
// distinct prompts are sent at once to a fresh instance, each on its own connection; the
// fake upstream holds every call until the figures are taken, then answers them all.
// Each run measures both builds, in alternating order.

const (
	h1Own      = "h1Transport"
	h1NetHTTP  = "net/http Transport"
	h1BuildTag = "nethttpowners"
)

// h1Row is one build's figures in one run.
type h1Row struct {
	Transport string `json:"transport"`
	N         int    `json:"in_flight"`
	BaseRSS   int64  `json:"base_rss_bytes"`
	RSS       int64  `json:"rss_bytes"`
	// BaseHeap and Heap are go_memstats_heap_inuse_bytes right after a collection (forced
	// through pprof's heap?gc=1), idle and with every call in flight; BaseStack and Stack
	// go_memstats_stack_inuse_bytes then: goroutines' stacks are not in the heap.
	BaseHeap       float64 `json:"base_heap_inuse_bytes"`
	Heap           float64 `json:"heap_inuse_bytes"`
	BaseStack      float64 `json:"base_stack_inuse_bytes"`
	Stack          float64 `json:"stack_inuse_bytes"`
	BaseGoroutines float64 `json:"base_goroutines"`
	Goroutines     float64 `json:"goroutines"`
	FDs            int     `json:"open_fds"`
	// CPUSeconds is the instance's CPU time from the first request sent to the last answer
	// read: dialling, writing, holding, reading and answering every call.
	CPUSeconds     float64 `json:"cpu_seconds"`
	SettleSeconds  float64 `json:"seconds_until_all_waiting"`
	ReleaseSeconds float64 `json:"seconds_from_release_to_last_answer"`
	OK             int     `json:"answered_200_as_owner"`
	NotOwned       int     `json:"answered_200_not_as_owner"`
	Errors         int     `json:"errors"`
	Note           string  `json:"note,omitempty"`
}

func (r h1Row) rssPerCall() float64  { return float64(r.RSS-r.BaseRSS) / float64(r.N) }
func (r h1Row) heapPerCall() float64 { return (r.Heap - r.BaseHeap) / float64(r.N) }

// liveMemPerCall is heap and stacks in use after a collection, per call: the memory the
// calls hold, without what the collector has not yet given back.
func (r h1Row) liveMemPerCall() float64 {
	return (r.Heap + r.Stack - r.BaseHeap - r.BaseStack) / float64(r.N)
}
func (r h1Row) gorPerCall() float64 { return (r.Goroutines - r.BaseGoroutines) / float64(r.N) }
func (r h1Row) cpuPerCall() float64 { return r.CPUSeconds / float64(r.N) }

// h1N is how many calls fit in flight at once: the instance holds a client and an
// upstream connection for each, besides a few hundred descriptors of its own.
func h1N(want int, fdLimit uint64) (int, string) {
	if most := int(fdLimit-512) / 2; want > most {
		return most, fmt.Sprintf("%d, not %d: an instance holding two connections per call needs 2N fds and the open-file limit here is %d", most, want, fdLimit)
	}
	return want, ""
}

// h1Compare runs the h1 measurement c.runs times.
func (e *env) h1Compare(ctx context.Context, c cfg, fdLimit uint64) ([]h1Row, error) {
	otherBin := filepath.Join(e.dir, "bin", "llm-dedupe-proxy-nethttp")
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "pprof,"+h1BuildTag, "-o", otherBin, "./cmd/llm-dedupe-proxy")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build -tags %s: %v\n%s", h1BuildTag, err, out)
	}
	n, note := h1N(c.h1N, fdLimit)
	builds := [][2]string{{h1Own, e.proxyBin}, {h1NetHTTP, otherBin}}
	var rows []h1Row
	for run := range c.runs {
		for i := range builds {
			b := builds[(i+run)%2]
			row, err := e.h1Case(ctx, b[0], b[1], n, fmt.Sprintf("%s h1 run %d %s", e.runID, run+1, b[0]))
			if err != nil {
				return rows, fmt.Errorf("%s, run %d: %w", b[0], run+1, err)
			}
			row.Note = joinNote(row.Note, note)
			logf("  %-18s n=%d RSS %d → %d MiB (%.1f KiB/call), heap + stacks %.1f KiB/call, %.0f goroutines, CPU %.3f ms/call; %d ok, %d errors",
				row.Transport, row.N, row.BaseRSS>>20, row.RSS>>20, row.rssPerCall()/1024, row.liveMemPerCall()/1024,
				row.Goroutines, row.cpuPerCall()*1000, row.OK, row.Errors)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// h1Case measures one build with n calls in flight, its prompts made of prefix: unique
// to the case, or they would be answered from Redis by an earlier case's calls.
func (e *env) h1Case(ctx context.Context, transport, bin string, n int, prefix string) (h1Row, error) {
	row := h1Row{Transport: transport, N: n}
	if err := e.setFake(ctx, behavior{}); err != nil {
		return row, err
	}
	pport, err := freePort()
	if err != nil {
		return row, err
	}
	p, base, err := startProxy(ctx, &e.ps, e.dir, bin, fmt.Sprintf("proxy-h1-%d", time.Now().UnixNano()), e.fakeURL, e.redisAddr(),
		"LLM_DEDUPE_PPROF_LISTEN="+loopback(pport))
	if err != nil {
		return row, err
	}
	defer e.ps.remove(p)
	url := chatURL(base)
	for i := range 50 { // warm-up: pools, lazily built state
		e.c.post(ctx, url, chatBody(fmt.Sprintf("%s warm %d", prefix, i), false), false)
	}
	time.Sleep(time.Second)
	if row.BaseRSS, err = rssBytes(p.pid()); err != nil {
		return row, err
	}
	if row.BaseHeap, row.BaseStack, row.BaseGoroutines, err = e.heapAfterGC(ctx, base, pport); err != nil {
		return row, err
	}
	if err := e.setFake(ctx, behavior{Hold: true}); err != nil {
		return row, err
	}
	cl := newClient() // each call on a connection of its own, all closed afterwards
	defer cl.tr.CloseIdleConnections()
	replies := make([]reply, n)
	var wg sync.WaitGroup
	cpu := startCPU([]string{"instance"}, []int{p.pid()})
	start := time.Now()
	for i := range n {
		if i%500 == 499 {
			time.Sleep(50 * time.Millisecond) // do not overflow the listen backlog
		}
		body := chatBody(fmt.Sprintf("%s #%d", prefix, i), false)
		wg.Go(func() { replies[i] = cl.post(ctx, url, body, false) })
	}
	if err := e.waitFor(ctx, 120*time.Second, func() (bool, error) {
		v, err := e.metric(ctx, base, "llm_dedupe_waiting_requests")
		return v >= float64(n), err
	}); err != nil {
		row.Note = "not all waiting: " + err.Error()
	}
	row.SettleSeconds = time.Since(start).Seconds()
	time.Sleep(2 * time.Second) // blocked reads and goroutines settle
	if row.RSS, err = rssBytes(p.pid()); err != nil {
		return row, err
	}
	row.FDs = countFDs(p.pid())
	if row.Heap, row.Stack, row.Goroutines, err = e.heapAfterGC(ctx, base, pport); err != nil {
		return row, err
	}
	released := time.Now()
	if err := e.releaseFake(ctx); err != nil {
		return row, err
	}
	wg.Wait()
	row.ReleaseSeconds = time.Since(released).Seconds()
	row.CPUSeconds = stopCPU(cpu)[0].Seconds
	for _, r := range replies {
		switch {
		case !r.ok():
			row.Errors++
		case r.role != "owner":
			row.NotOwned++
		default:
			row.OK++
		}
	}
	if row.NotOwned > 0 {
		row.Note = joinNote(row.Note, fmt.Sprintf("%d answers not an owner's: those calls were not in flight", row.NotOwned))
	}
	return row, e.setFake(ctx, behavior{})
}

// heapAfterGC forces a collection in the instance (pprof's heap profile with gc=1) and
// reads its heap and stacks in use and its goroutines.
func (e *env) heapAfterGC(ctx context.Context, base string, pport int) (heap, stack, goroutines float64, err error) {
	if _, err = e.c.get(ctx, fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", loopback(pport))); err != nil {
		return 0, 0, 0, err
	}
	if heap, err = e.metric(ctx, base, "go_memstats_heap_inuse_bytes"); err != nil {
		return 0, 0, 0, err
	}
	if stack, err = e.metric(ctx, base, "go_memstats_stack_inuse_bytes"); err != nil {
		return 0, 0, 0, err
	}
	goroutines, err = e.metric(ctx, base, "go_goroutines")
	return heap, stack, goroutines, err
}

// h1Ratios pairs each run's two rows: h1Transport's figure over net/http's, per call.
type h1Ratios struct{ RSS, Live, Heap, Goroutines, CPU []float64 }

func h1RatiosOf(rows []h1Row) h1Ratios {
	var r h1Ratios
	for i := 0; i+1 < len(rows); i += 2 {
		own, other := rows[i], rows[i+1]
		if own.Transport != h1Own {
			own, other = other, own
		}
		r.RSS = append(r.RSS, own.rssPerCall()/other.rssPerCall())
		r.Live = append(r.Live, own.liveMemPerCall()/other.liveMemPerCall())
		r.Heap = append(r.Heap, own.heapPerCall()/other.heapPerCall())
		r.Goroutines = append(r.Goroutines, own.gorPerCall()/other.gorPerCall())
		r.CPU = append(r.CPU, own.cpuPerCall()/other.cpuPerCall())
	}
	return r
}

func h1Section(b *strings.Builder, r *results) {
	if len(r.H1) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Owners' calls: h1Transport against net/http's Transport\n\nA fresh instance per row, warmed with 50 requests; then N distinct prompts at once, each on its own client connection, whose calls to the plain-HTTP fake upstream are held until the figures are taken, then answered. Per call = (while in flight − idle) / N. Heap and stacks in use are read right after a forced collection: the memory the calls hold, where RSS also holds what the collector has not yet given back. CPU is the instance's, from the first request sent to the last answer read. Each run measures both, in alternating order.\n\n")
	w("| run | transport | in flight | RSS idle → in flight | RSS per call | heap + stacks in use per call | of which heap | goroutines (per call) | open fds | CPU per call | answered 200 by its owner | note |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for i, row := range r.H1 {
		w("| %d | %s | %d | %.0f → %.0f MiB | %.1f KiB | %.1f KiB | %.1f KiB | %.0f (%.2f) | %d | %.3f ms | %d of %d | %s |\n", i/2+1, row.Transport, row.N,
			float64(row.BaseRSS)/(1<<20), float64(row.RSS)/(1<<20), row.rssPerCall()/1024, row.liveMemPerCall()/1024, row.heapPerCall()/1024,
			row.Goroutines, row.gorPerCall(), row.FDs, row.cpuPerCall()*1000, row.OK, row.N, row.Note)
	}
	rt := h1RatiosOf(r.H1)
	w("\nh1Transport ÷ net/http's Transport, per call (median over runs): RSS %.2f, heap + stacks in use %.2f (heap %.2f), goroutines %.2f, CPU %.2f.\n\n",
		median(rt.RSS), median(rt.Live), median(rt.Heap), median(rt.Goroutines), median(rt.CPU))
}
