package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// The owner process stands for another proxy instance whose upstream calls are running: a
// singleflight.Group that owns one flight per prompt and holds every call until told to
// release them, so that the instance measured follows them through Redis exactly as it
// would follow another instance. It is this binary run again with ownersEnv set, not a
// Group inside the harness: there its 10,000 final writes shared a scheduler, a garbage
// collector and a Redis pool with the load generator's 10,000 connections, and the Redis
// client count mixed the harness's pool with the proxy's.
//
// The protocol, one line each way: the owner process prints "owned N" once it owns every
// flight, reads a line (or end of file) from stdin and releases them all, and once its
// owners have all written their answers writes an ownersReport to the file the harness
// named, prints "done S" (S seconds after it read the line), closes its Group and exits.
// End of file before that line also releases and exits.

// ownersEnv names the file holding the owner process's ownersSpec; set, the binary is the
// owner process instead of the harness.
const ownersEnv = "LLM_DEDUPE_BENCH_OWNERS"

// ownersSpec is what the owner process is given, in a file: ten thousand bodies do not fit
// in argv.
type ownersSpec struct {
	Redis  string   `json:"redis"`
	Auth   string   `json:"authorization"`
	Bodies [][]byte `json:"bodies"`
	Report string   `json:"report"` // where to write the ownersReport
}

// ownersReport is what the owner process saw after the release, timed from when it read
// the release line.
type ownersReport struct {
	DoneSeconds float64 `json:"done_seconds"` // its last flight ended
	// EndSeconds is when each body's flight ended, its final write done (index as in
	// ownersSpec.Bodies).
	EndSeconds []float64 `json:"flight_end_seconds"`
	// LeasesLost counts the flights another instance took over (the owner's call was
	// cancelled or its final write refused); RenewalsFailed the renewals that failed.
	LeasesLost     int `json:"leases_lost"`
	RenewalsFailed int `json:"renewals_failed"`
	// CPUSeconds is the CPU time the owner process used from the release to its last
	// flight's end.
	CPUSeconds float64 `json:"cpu_seconds"`
}

// flightEnds records when each owned flight ends, and the leases lost on the way. The
// Group calls Observe synchronously from its goroutines.
type flightEnds struct {
	index map[string]int // key → body
	all   chan struct{}  // closed when every flight has ended

	mu             sync.Mutex
	at             []time.Time
	left           int
	lost           map[string]bool
	renewalsFailed int
}

func newFlightEnds(keys []string) *flightEnds {
	f := &flightEnds{index: map[string]int{}, all: make(chan struct{}), at: make([]time.Time, len(keys)), lost: map[string]bool{}}
	for i, k := range keys {
		f.index[k] = i
	}
	f.left = len(f.index)
	return f
}

func (f *flightEnds) Observe(ev singleflight.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch ev.Kind {
	case singleflight.EventFlightEnd:
		if i, ok := f.index[ev.Key]; ok && f.at[i].IsZero() {
			f.at[i] = time.Now()
			if f.left--; f.left == 0 {
				close(f.all)
			}
		}
	case singleflight.EventLeaseLost, singleflight.EventFencedWrite:
		f.lost[ev.Key] = true
	case singleflight.EventHeartbeatFailed:
		f.renewalsFailed++
	}
}

// report is what the flights did after start.
func (f *flightEnds) report(start time.Time) ownersReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := ownersReport{EndSeconds: make([]float64, len(f.at)), LeasesLost: len(f.lost), RenewalsFailed: f.renewalsFailed}
	for i, t := range f.at {
		r.EndSeconds[i] = t.Sub(start).Seconds()
		r.DoneSeconds = max(r.DoneSeconds, r.EndSeconds[i])
	}
	return r
}

// runAsOwners runs the owner process and exits, if this process was started as one.
func runAsOwners() {
	path := os.Getenv(ownersEnv)
	if path == "" {
		return
	}
	if err := holdOwners(context.Background(), path, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench owners:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// benchHasher makes the keys the proxy makes with its default configuration.
func benchHasher() (*hashing.Hasher, error) {
	scope, err := hashing.ParseScope("credential")
	if err != nil {
		return nil, err
	}
	return hashing.New(hashing.Options{Scope: scope, IgnoreFields: []string{"user"}}), nil
}

func heldAnswer(i int) []byte {
	return fmt.Appendf(nil, `{"id":"held-%d","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"held"},"finish_reason":"stop"}]}`, i)
}

// holdOwners is the owner process: see ownersEnv.
func holdOwners(ctx context.Context, specPath string, in io.Reader, out io.Writer) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec ownersSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	h, err := benchHasher()
	if err != nil {
		return err
	}
	header := http.Header{"Authorization": {spec.Auth}, "Content-Type": {"application/json"}}
	keys := make([]string, len(spec.Bodies))
	for i, body := range spec.Bodies {
		req, err := h.Key(http.MethodPost, "/v1/chat/completions", header, body)
		if err != nil {
			return err
		}
		keys[i] = req.Key
	}
	ends := newFlightEnds(keys)
	// go-redis's default pool (10 connections per CPU), as a proxy instance has by default.
	rdb := redis.NewClient(&redis.Options{Addr: spec.Redis})
	defer rdb.Close()
	g := singleflight.New(singleflight.Options{Redis: rdb, ResultTTL: time.Minute, Observer: ends})
	gate := make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	var readers []*singleflight.Reader
	defer func() {
		release()
		for _, r := range readers {
			for {
				if _, err := r.Next(ctx); err != nil {
					if !errors.Is(err, io.EOF) {
						fmt.Fprintln(os.Stderr, "bench owners: held owner:", err)
					}
					break
				}
			}
			r.Close()
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = g.Close(cctx)
	}()

	for i, key := range keys {
		answer := heldAnswer(i)
		r, err := g.Do(key, false, func(ctx context.Context, w *singleflight.Writer) (singleflight.Result, error) {
			select {
			case <-gate:
			case <-ctx.Done():
				return singleflight.Result{}, ctx.Err()
			}
			return singleflight.Result{Head: singleflight.Head{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}}, Body: answer}, nil
		})
		if err != nil {
			return err
		}
		readers = append(readers, r)
	}
	// Owned has no change notification: poll it.
	n := len(spec.Bodies)
	deadline := time.Now().Add(60 * time.Second)
	for g.Owned() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d flights owned after 60s", g.Owned(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := fmt.Fprintf(out, "owned %d\n", n); err != nil {
		return err
	}

	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		// The harness is gone or gave up: release and leave.
		fmt.Fprintf(os.Stderr, "bench owners: no release (%v): leaving\n", err)
		return nil
	}
	cpu, cpuErr := cpuTime(0)
	start := time.Now()
	release()
	<-ends.all
	rep := ends.report(start)
	rep.CPUSeconds = -1 // unknown, unless both readings are there
	if end, err := cpuTime(0); err == nil && cpuErr == nil {
		rep.CPUSeconds = (end - cpu).Seconds()
	}
	b, err = json.Marshal(rep)
	if err != nil {
		return err
	}
	if err := os.WriteFile(spec.Report, b, 0o600); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "done %.6f\n", rep.DoneSeconds)
	return err
}

// ownerProc is the harness's handle on the owner process.
type ownerProc struct {
	p      *proc
	stdin  io.WriteCloser
	lines  chan string // its stdout, line by line
	report string      // where it writes its ownersReport
}

// startOwners starts the owner process with one flight per body, on e's Redis, and returns
// once it owns them all.
func (e *env) startOwners(ctx context.Context, bodies [][]byte) (*ownerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	reportPath := filepath.Join(e.dir, "owners-report.json")
	spec, err := json.Marshal(ownersSpec{Redis: e.redisAddr(), Auth: e.c.auth, Bodies: bodies, Report: reportPath})
	if err != nil {
		return nil, err
	}
	specPath := filepath.Join(e.dir, "owners.json")
	if err := os.WriteFile(specPath, spec, 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(e.dir, "owners.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), ownersEnv+"="+specPath)
	cmd.Stderr = lf
	// Its own process group, killed with the harness (Pdeathsig) or by procs.stopAll.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start owners: %w", err)
	}
	p := &proc{name: "owners", cmd: cmd, log: logPath, done: make(chan struct{})}
	e.ps.list = append(e.ps.list, p)
	o := &ownerProc{p: p, stdin: stdin, lines: make(chan string, 4), report: reportPath}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case o.lines <- sc.Text():
			default: // more than the protocol's lines: nobody reads them
			}
		}
		_ = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	line, err := o.line(ctx, "owned ", 120*time.Second)
	if err != nil {
		e.ps.remove(p)
		return nil, err
	}
	if line != strconv.Itoa(len(bodies)) {
		e.ps.remove(p)
		return nil, fmt.Errorf("owners: owned %s; want %d", line, len(bodies))
	}
	return o, nil
}

// line waits for the owner process's next line, which must start with prefix, and
// returns the rest of it.
func (o *ownerProc) line(ctx context.Context, prefix string, limit time.Duration) (string, error) {
	var l string
	select {
	case l = <-o.lines:
	case <-o.p.done:
		// Its lines were all queued before done was closed: one it printed before exiting
		// (such as "done", after which it exits at once) is still there.
		select {
		case l = <-o.lines:
		default:
			return "", fmt.Errorf("owners exited (%v):\n%s", o.p.cmd.ProcessState, o.p.tail())
		}
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(limit):
		return "", fmt.Errorf("owners: no %q line within %v:\n%s", prefix, limit, o.p.tail())
	}
	rest, ok := strings.CutPrefix(l, prefix)
	if !ok {
		return "", fmt.Errorf("owners: got %q; want %q…", l, prefix)
	}
	return rest, nil
}

// release tells the owner process to let every held call answer.
func (o *ownerProc) release() error {
	_, err := io.WriteString(o.stdin, "release\n")
	return err
}

// done waits until the owner process reports that its owners have all written their
// answers, and returns its report.
func (o *ownerProc) done(ctx context.Context) (ownersReport, error) {
	var rep ownersReport
	if _, err := o.line(ctx, "done ", 60*time.Second); err != nil {
		return rep, err
	}
	b, err := os.ReadFile(o.report)
	if err != nil {
		return rep, err
	}
	return rep, json.Unmarshal(b, &rep)
}

// close ends the owner process: on end of file it releases what it still holds, closes its
// Group and exits; if it has not within 15s, it is killed.
func (o *ownerProc) close(ps *procs) {
	o.stdin.Close()
	select {
	case <-o.p.done:
	case <-time.After(15 * time.Second):
	}
	ps.remove(o.p)
}
