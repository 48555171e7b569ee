package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// client is the load generator's HTTP client: HTTP/1.1 keep-alive over loopback, enough
// idle connections per host that a burst never redials, no compression (the proxy and the
// fake upstream send plain bytes, so nothing is decompressed on either side).
type client struct {
	hc   *http.Client
	tr   *http.Transport
	auth string
}

func newClient() *client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0, // no total limit
		MaxIdleConnsPerHost: 20000,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &client{hc: &http.Client{Transport: tr}, tr: tr, auth: "Bearer sk-bench"}
}

// newTLSClient is newClient trusting the certificate in certFile as well.
func newTLSClient(certFile string) (*client, error) {
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", certFile)
	}
	c := newClient()
	c.tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	return c, nil
}

// reply is what one request saw, with the times the harness measures on the client.
type reply struct {
	status int
	role   string // X-Dedupe-Role from the proxy, X-Cache-Status from nginx, "" direct
	sent   time.Time
	first  time.Time // first byte of the body (the first chunk of a stream)
	end    time.Time // last byte of the body
	err    error
	body   []byte
}

func (r reply) ok() bool { return r.err == nil && r.status == http.StatusOK }

func (r reply) latency() time.Duration { return r.end.Sub(r.sent) }

// post sends one request and reads its answer to the end, noting when the first and the
// last bytes arrived.
func (c *client) post(ctx context.Context, url string, body []byte, keep bool) reply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", c.auth)
	r := reply{sent: time.Now()}
	resp, err := c.hc.Do(req)
	if err != nil {
		r.err, r.end = err, time.Now()
		return r
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	r.role = resp.Header.Get("X-Dedupe-Role")
	if r.role == "" {
		r.role = resp.Header.Get("X-Cache-Status")
	}
	var buf bytes.Buffer
	chunk := make([]byte, 16<<10)
	for {
		n, err := resp.Body.Read(chunk)
		if n > 0 {
			if r.first.IsZero() {
				r.first = time.Now()
			}
			if keep {
				buf.Write(chunk[:n])
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			r.err = err
			break
		}
	}
	r.end = time.Now()
	if keep {
		r.body = buf.Bytes()
	}
	return r
}

// get fetches url and returns its body.
func (c *client) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

// warmConns opens n connections to base (concurrent GETs of path) so that a burst that
// follows measures requests, not TCP handshakes.
func (c *client) warmConns(ctx context.Context, base, path string, n int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, _ = c.get(ctx, base+path)
		})
	}
	wg.Wait()
}

// systemPrompt makes request bodies about the size of a real chat request (~1 KB), so
// that reading, hashing and keying them costs what it would.
var systemPrompt = strings.Repeat("You are a careful assistant. Answer briefly and cite the source of every fact. ", 11)

// chatBody is a chat completion request whose user message is content.
func chatBody(content string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":       "bench-model",
		"temperature": 0,
		"stream":      stream,
		"messages": []map[string]string{
			{"role": "system", "content": systemPrompt},
			{"role": "user", "content": content},
		},
	})
	return b
}

// loadResult is one closed-loop run: every request that started after the warm-up and
// ended inside the measured window.
type loadResult struct {
	Lat       []time.Duration `json:"-"`
	Completed int             `json:"completed"`
	Errors    int             `json:"errors"`
	Roles     map[string]int  `json:"roles"`
	Seconds   float64         `json:"seconds"` // the window; interleaved: the target's requests' own time
	RPS       float64         `json:"rps"`
	Summary   summary         `json:"latency"`
	Samples   []float64       `json:"samples_ms,omitempty"`
}

// record counts one measured reply: its latency and role, or an error.
func (res *loadResult) record(r reply) {
	if r.ok() {
		res.Lat = append(res.Lat, r.latency())
		res.Roles[r.role]++
	} else {
		res.Errors++
	}
}

// closedLoop runs conc workers that each send a request as soon as their last one ended:
// warm first (not recorded), then dur measured. body(i) makes the i-th request.
func (c *client) closedLoop(ctx context.Context, url string, conc int, warm, dur time.Duration, body func(i int64) []byte) loadResult {
	var (
		seq    atomic.Int64
		mu     sync.Mutex
		res    = loadResult{Roles: map[string]int{}}
		wg     sync.WaitGroup
		start  = time.Now()
		from   = start.Add(warm)
		until  = from.Add(dur)
		ctx2   context.Context
		cancel context.CancelFunc
	)
	ctx2, cancel = context.WithDeadline(ctx, until.Add(30*time.Second))
	defer cancel()
	for range conc {
		wg.Go(func() {
			for time.Now().Before(until) && ctx2.Err() == nil {
				r := c.post(ctx2, url, body(seq.Add(1)), false)
				if r.sent.Before(from) || r.end.After(until) {
					continue
				}
				mu.Lock()
				res.record(r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Completed = len(res.Lat)
	res.Seconds = dur.Seconds()
	res.RPS = float64(res.Completed) / dur.Seconds()
	res.Summary = summarize(res.Lat)
	return res
}

// interleaved sends one request at a time to each target in turn, the order rotated every
// round, warm first (not recorded), then for dur: one client whose requests to the targets
// alternate, so that whatever the shared machine does meanwhile (another tenant, a CPU
// changing speed) falls on every target alike. Measuring one target after another, a few
// seconds each, the difference between two of them moved by more than the difference
// itself. body(i) makes the requests to targets[i].
func (c *client) interleaved(ctx context.Context, targets []target, warm, dur time.Duration, rotate int, body func(i int) func(int64) []byte) []loadResult {
	out := make([]loadResult, len(targets))
	bodies := make([]func(int64) []byte, len(targets))
	for i := range targets {
		out[i].Roles = map[string]int{}
		bodies[i] = body(i)
	}
	start := time.Now()
	from, until := start.Add(warm), start.Add(warm+dur)
	ctx, cancel := context.WithDeadline(ctx, until.Add(30*time.Second))
	defer cancel()
	for round := int64(0); time.Now().Before(until) && ctx.Err() == nil; round++ {
		for j := range targets {
			i := (j + rotate + int(round)) % len(targets)
			r := c.post(ctx, targets[i].url, bodies[i](round), false)
			if r.sent.Before(from) || r.end.After(until) {
				continue
			}
			out[i].record(r)
		}
	}
	for i := range out {
		// A target had the client for the time its own requests took: its throughput is
		// what one client alone would have had.
		var busy time.Duration
		for _, l := range out[i].Lat {
			busy += l
		}
		out[i].Completed = len(out[i].Lat)
		out[i].Seconds = busy.Seconds()
		if busy > 0 {
			out[i].RPS = float64(out[i].Completed) / busy.Seconds()
		}
		out[i].Summary = summarize(out[i].Lat)
	}
	return out
}

// burst sends all bodies at once (released together by a barrier) to urls[i%len(urls)]
// and returns the replies in order.
func (c *client) burst(ctx context.Context, urls []string, bodies [][]byte) []reply {
	out := make([]reply, len(bodies))
	gate := make(chan struct{})
	var ready, wg sync.WaitGroup
	for i, b := range bodies {
		ready.Add(1)
		wg.Go(func() {
			ready.Done()
			<-gate
			out[i] = c.post(ctx, urls[i%len(urls)], b, false)
		})
	}
	ready.Wait()
	close(gate)
	wg.Wait()
	return out
}

func msSamples(d []time.Duration) []float64 {
	out := make([]float64, len(d))
	for i, v := range d {
		out[i] = float64(v.Microseconds()) / 1000
	}
	return out
}
