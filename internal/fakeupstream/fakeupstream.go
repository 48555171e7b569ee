// Package fakeupstream is an OpenAI-compatible API for tests: it numbers its replies,
// counts calls and abandoned calls, and can delay, fail, stream and hold.
package fakeupstream

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is the fake API. The zero value answers at once; set behaviour with Set.
type Upstream struct {
	calls     atomic.Int64
	abandoned atomic.Int64
	completed atomic.Int64

	mu       sync.Mutex
	behavior Behavior
	hold     chan struct{} // closed by Release
	started  chan struct{} // closed and replaced when a call starts
	changed  chan struct{} // closed and replaced when a counter moves
	log      []Call
}

// Behavior is what the next calls do.
type Behavior struct {
	Delay  time.Duration `json:"delay"`  // before the answer (unary) or between events (stream)
	Fail   []int         `json:"fail"`   // statuses of the next calls, consumed one per call
	Hold   bool          `json:"hold"`   // hold the answer (unary) or the last event (stream) until Release
	Chunks int           `json:"chunks"` // content events of a stream; 0 means 5
	// RetryAfter is sent with a 429 from Fail.
	RetryAfter string `json:"retry_after"`
}

// Call is one request the fake received.
type Call struct {
	N             int64  `json:"n"`
	Path          string `json:"path"`
	Authorization string `json:"authorization"`
	Body          string `json:"body"`
	Proto         string `json:"proto"`                 // HTTP/1.1, HTTP/2.0
	Traceparent   string `json:"traceparent,omitempty"` // the W3C trace context it was sent
	// Sent is how many events (of a stream) it sent; CutAt, when its client closed it
	// before the end (zero if it did not).
	Sent  int       `json:"sent"`
	CutAt time.Time `json:"cut_at,omitzero"`
}

// Stats are the counters of an Upstream, as GET /_fake/stats and /_fake/wait answer them.
type Stats struct {
	Calls     int64 `json:"calls"`
	Abandoned int64 `json:"abandoned"`
	Completed int64 `json:"completed"`
}

// New returns an Upstream.
func New() *Upstream {
	return &Upstream{hold: make(chan struct{}), started: make(chan struct{}), changed: make(chan struct{})}
}

// count adds one to c and wakes everyone waiting for a counter to move.
func (u *Upstream) count(c *atomic.Int64) {
	c.Add(1)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.notifyLocked()
}

// notifyLocked wakes the waiters of Changed; u.mu must be held.
func (u *Upstream) notifyLocked() {
	if u.changed != nil {
		close(u.changed)
	}
	u.changed = make(chan struct{})
}

// Changed returns a channel closed when a counter next moves.
func (u *Upstream) Changed() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.changed == nil {
		u.changed = make(chan struct{})
	}
	return u.changed
}

// Stats returns the counters.
func (u *Upstream) Stats() Stats {
	return Stats{Calls: u.Calls(), Abandoned: u.Abandoned(), Completed: u.Completed()}
}

// Wait blocks until every counter is at least the one in want, or d has passed; it returns
// the counters and whether they reached want. Tests in other processes use it through
// GET /_fake/wait, so that they wait for an event instead of polling.
func (u *Upstream) Wait(want Stats, d time.Duration) (Stats, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ch := u.Changed() // before the check: a move after it closes ch
		s := u.Stats()
		if s.Calls >= want.Calls && s.Abandoned >= want.Abandoned && s.Completed >= want.Completed {
			return s, true
		}
		select {
		case <-ch:
		case <-timer.C:
			return u.Stats(), false
		}
	}
}

// Set replaces the behaviour and re-arms the hold.
func (u *Upstream) Set(b Behavior) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.behavior = b
	u.hold = make(chan struct{})
}

// Release lets held answers go.
func (u *Upstream) Release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.releaseLocked()
}

// ReleaseHeld lets the answers held so far go and holds those of the calls that come
// after it, in one step: a test can let a first call end and catch the next one held.
func (u *Upstream) ReleaseHeld() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.releaseLocked()
	u.hold = make(chan struct{})
}

// releaseLocked closes the hold once; u.mu held.
func (u *Upstream) releaseLocked() {
	select {
	case <-u.hold:
	default:
		close(u.hold)
	}
}

// Calls is the number of model calls received; Abandoned those whose client left before
// the answer was complete; Completed those answered to the end.
func (u *Upstream) Calls() int64     { return u.calls.Load() }
func (u *Upstream) Abandoned() int64 { return u.abandoned.Load() }
func (u *Upstream) Completed() int64 { return u.completed.Load() }

// Log returns the calls received so far.
func (u *Upstream) Log() []Call {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Call(nil), u.log...)
}

// Started returns a channel closed when the next call starts.
func (u *Upstream) Started() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.started
}

// ServeHTTP answers model calls under any prefix, and the control API under /_fake/.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_fake/") {
		u.control(w, r)
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
		// Not a model call: what the image's HEALTHCHECK asks, when the fake runs in it.
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`)
		return
	}
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model","owned_by":"fake"}]}`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	n := u.calls.Add(1)
	u.mu.Lock()
	b := u.behavior
	status := 0
	if len(b.Fail) > 0 {
		status = b.Fail[0]
		u.behavior.Fail = b.Fail[1:]
	}
	hold := u.hold
	u.log = append(u.log, Call{N: n, Path: r.URL.Path, Authorization: r.Header.Get("Authorization"), Body: string(body), Proto: r.Proto,
		Traceparent: r.Header.Get("Traceparent")})
	close(u.started)
	u.started = make(chan struct{})
	u.notifyLocked()
	u.mu.Unlock()

	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		EncodingFormat string `json:"encoding_format"`
	}
	_ = json.Unmarshal(body, &req)
	w.Header().Set("X-Request-Id", fmt.Sprintf("req_%d", n))
	w.Header().Set("Openai-Processing-Ms", "7")
	// A fixture, not a secret: the tests check that no cookie reaches a follower or a hit.
	w.Header().Set("Set-Cookie", "session=secret")
	ctx := r.Context()
	wait := func(d time.Duration) bool {
		if d <= 0 {
			return true
		}
		select {
		case <-time.After(d):
			return true
		case <-ctx.Done():
			return false
		}
	}
	if status != 0 {
		if !wait(b.Delay) || (b.Hold && !waitHold(r, hold)) {
			u.cut(n, 0)
			return
		}
		if status == http.StatusTooManyRequests && b.RetryAfter != "" {
			w.Header().Set("Retry-After", b.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":"fake failure %d of call %d","type":"fake_error","code":"fake_%d"}}`, status, n, status)
		u.count(&u.completed)
		return
	}
	if req.Stream {
		u.stream(w, r, n, req.Model, req.StreamOptions.IncludeUsage, b, hold, wait)
		return
	}
	if !wait(b.Delay) || (b.Hold && !waitHold(r, hold)) {
		u.cut(n, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if req.EncodingFormat == "base64" && strings.HasSuffix(r.URL.Path, "/embeddings") {
		io.WriteString(w, EmbeddingBase64(n, req.Model))
	} else {
		io.WriteString(w, Unary(r.URL.Path, n, req.Model))
	}
	u.count(&u.completed)
}

// EmbeddingBase64 is the answer of call n to an embeddings request with encoding_format
// base64 (the Node SDK's default): Unary's vector as little-endian float32s in base64.
func EmbeddingBase64(n int64, model string) string {
	var b []byte
	for _, f := range []float32{float32(n), 0.5, -0.25} {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return fmt.Sprintf(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":%q}],"model":%q,"usage":{"prompt_tokens":5,"total_tokens":5}}`,
		base64.StdEncoding.EncodeToString(b), model)
}

func waitHold(r *http.Request, hold chan struct{}) bool {
	select {
	case <-hold:
		return true
	case <-r.Context().Done():
		return false
	}
}

// Unary is the exact body of the numbered answer of call n in the shape of the route's API,
// so tests can compare bytes.
func Unary(path string, n int64, model string) string {
	switch {
	case strings.HasSuffix(path, "/embeddings"):
		return fmt.Sprintf(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[%d,0.5,-0.25]}],"model":%q,"usage":{"prompt_tokens":5,"total_tokens":5}}`, n, model)
	case strings.HasSuffix(path, "/responses"):
		return fmt.Sprintf(`{"id":"resp_%d","object":"response","status":"completed","model":%q,"output":[{"type":"message","id":"msg_%d","status":"completed","role":"assistant","content":[{"type":"output_text","text":"reply %d","annotations":[]}]}],"usage":{"input_tokens":11,"output_tokens":7,"total_tokens":18}}`, n, model, n, n)
	case strings.HasSuffix(path, "/chat/completions"):
		return fmt.Sprintf(`{"id":"chatcmpl-%d","object":"chat.completion","created":1700000000,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"reply %d"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`, n, model, n)
	}
	return fmt.Sprintf(`{"id":"cmpl-%d","object":"text_completion","created":1700000000,"model":%q,"choices":[{"index":0,"text":"reply %d","finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`, n, model, n)
}

// stream answers with numbered SSE events, holding the last content event if asked.
func (u *Upstream) stream(w http.ResponseWriter, r *http.Request, n int64, model string, usage bool, b Behavior, hold chan struct{}, wait func(time.Duration) bool) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache, must-revalidate")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	chunks := b.Chunks
	if chunks <= 0 {
		chunks = 5
	}
	for i, ev := range StreamEvents(r.URL.Path, n, model, chunks, usage) {
		if ev.Last && b.Hold && !waitHold(r, hold) {
			u.cut(n, i)
			return
		}
		if !wait(b.Delay) {
			u.cut(n, i)
			return
		}
		if _, err := io.WriteString(w, ev.Text); err != nil || rc.Flush() != nil {
			u.cut(n, i)
			return
		}
		u.sent(n, i+1)
	}
	u.count(&u.completed)
}

// cut records that call n's client closed it after sent events, and counts it abandoned.
func (u *Upstream) cut(n int64, sent int) {
	now := time.Now()
	u.mu.Lock()
	for i := range u.log {
		if u.log[i].N == n {
			u.log[i].Sent, u.log[i].CutAt = sent, now
		}
	}
	u.mu.Unlock()
	u.count(&u.abandoned)
}

// sent records that call n has sent that many events.
func (u *Upstream) sent(n int64, sent int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := len(u.log) - 1; i >= 0; i-- {
		if u.log[i].N == n {
			u.log[i].Sent = sent
			return
		}
	}
}

// Event is one SSE event of a stream.
type Event struct {
	Text string
	Last bool // the last content event: the one Hold holds
}

// StreamEvents is the exact transcript of stream call n, so tests can compare bytes.
func StreamEvents(path string, n int64, model string, chunks int, usage bool) []Event {
	var evs []Event
	if strings.HasSuffix(path, "/responses") {
		evs = append(evs, Event{Text: fmt.Sprintf("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_%d\",\"status\":\"in_progress\"}}\n\n", n)})
		for i := range chunks {
			evs = append(evs, Event{Text: fmt.Sprintf("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"tok%d \"}\n\n", i), Last: i == chunks-1})
		}
		evs = append(evs, Event{Text: fmt.Sprintf("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_%d\",\"status\":\"completed\",\"model\":%q,\"usage\":{\"input_tokens\":11,\"output_tokens\":%d,\"total_tokens\":%d}}}\n\n", n, model, chunks, 11+chunks)})
		return evs
	}
	for i := range chunks {
		evs = append(evs, Event{Text: fmt.Sprintf("data: {\"id\":\"chatcmpl-%d\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", n, model, i), Last: i == chunks-1})
	}
	evs = append(evs, Event{Text: fmt.Sprintf("data: {\"id\":\"chatcmpl-%d\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", n, model)})
	if usage {
		evs = append(evs, Event{Text: fmt.Sprintf("data: {\"id\":\"chatcmpl-%d\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", n, model, chunks, 11+chunks)})
	}
	return append(evs, Event{Text: "data: [DONE]\n\n"})
}

// Transcript is StreamEvents joined.
func Transcript(path string, n int64, model string, chunks int, usage bool) string {
	var b strings.Builder
	for _, e := range StreamEvents(path, n, model, chunks, usage) {
		b.WriteString(e.Text)
	}
	return b.String()
}

// control is the HTTP API for tests in other processes: POST /_fake/behavior (a Behavior
// as JSON, delay in nanoseconds), POST /_fake/release, GET /_fake/stats, GET /_fake/calls
// (the Log as JSON), and GET /_fake/wait?calls=N&abandoned=N&completed=N&timeout=5s, which
// answers the stats once every counter given has reached its value (200), or when the
// timeout (default 10s) has passed (408).
func (u *Upstream) control(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/_fake/calls":
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(u.Log())
		return
	case "/_fake/wait":
		var want Stats
		q := r.URL.Query()
		for name, p := range map[string]*int64{"calls": &want.Calls, "abandoned": &want.Abandoned, "completed": &want.Completed} {
			if v := q.Get(name); v != "" {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					http.Error(w, name+": "+err.Error(), http.StatusBadRequest)
					return
				}
				*p = n
			}
		}
		d := 10 * time.Second
		if v := q.Get("timeout"); v != "" {
			var err error
			if d, err = time.ParseDuration(v); err != nil {
				http.Error(w, "timeout: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		s, ok := u.Wait(want, d)
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusRequestTimeout)
		}
		json.NewEncoder(w).Encode(s)
		return
	case "/_fake/behavior":
		var b Behavior
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		u.Set(b)
	case "/_fake/release":
		u.Release()
	case "/_fake/stats":
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(u.Stats())
		return
	default:
		http.NotFound(w, r)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
