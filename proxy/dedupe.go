package proxy

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// dedupe serves one deduplicated route: it reads a request's body, makes its key and
// answers it from the flight of that key, unless the request goes straight upstream.
func (p *Proxy) dedupe(route string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := stateFrom(r.Context())
		if st == nil { // not behind ServeHTTP's guard
			st = &reqState{}
		}
		if r.Header.Get(HeaderBypass) == "1" || Encoded(r.Header) {
			// Straight upstream: asked for, or a compressed body the key cannot see into.
			st.info.role = "bypass"
			w.Header().Set(HeaderRole, "bypass")
			p.pass.ServeHTTP(w, r)
			return
		}
		body, ok := p.readRequest(w, r)
		if !ok {
			return
		}
		req, cc, ok := p.keyOf(w, r, body)
		if !ok || !p.applySampling(w, r, p.samplingOf(route, req, r.Header), body, &cc, st) {
			return
		}
		st.info.key = req.Key
		if p.cfg.Tracing != nil {
			st.info.model, st.info.namespace = req.Model, r.Header.Get(HeaderNamespace)
		}
		p.join(w, r, route, req, cc, body, st)
	}
}

// readRequest reads a request's body, or answers why it cannot: larger than MaxBodyBytes
// (at once when its Content-Length says so), stalled, or cut short.
func (p *Proxy) readRequest(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() {
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			"the request body is larger than "+strconv.FormatInt(p.cfg.MaxBodyBytes, 10)+" bytes")
	}
	if r.ContentLength > p.cfg.MaxBodyBytes {
		tooLarge() // at once, without waiting for a body that would be refused
		return nil, false
	}
	body, err := readBody(w, r, p.cfg.MaxBodyBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			tooLarge()
		case errors.Is(err, errBodyTimeout):
			writeBodyTimeout(w)
		default:
			writeError(w, http.StatusBadRequest, "invalid_request_error", "body_unreadable", "the request body could not be read")
		}
		return nil, false
	}
	return body, true
}

// join answers a request from the flight of its key, started by it if there is none. A
// unary answer is read whole before any of it is sent: a request that starts its flight
// runs the call itself (no goroutine of the flight's own), and an answer too large to
// share is written to it straight from the call. See ADR 0029.
func (p *Proxy) join(w http.ResponseWriter, r *http.Request, route string, req hashing.Request, cc controls, body []byte, st *reqState) {
	info, ho := &st.info, &st.ho
	ho.wait.Context = r.Context()
	defer ho.close()
	fn := p.ownerFunc(route, req, r, body, p.storePolicy(route, req.Model, cc), ho)
	inline := !req.Stream
	if inline {
		ho.inlineW, ho.inlineKey = w, req.Key
		p.cfg.Recorder.WaitingAdd(1)
	}
	rd, err := p.cfg.Flights.DoWith(req.Key, singleflight.CallOptions{
		NoCache: cc.noCache, MaxAge: cc.maxAge, Route: route, Model: shortModel(req.Model), Inline: inline,
		Trace: trace.SpanContextFromContext(r.Context()), Finish: cc.finish, Context: r.Context(),
	}, fn)
	if inline {
		p.cfg.Recorder.WaitingAdd(-1)
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "the proxy is shutting down")
		return
	}
	defer rd.Close()
	if served, cut := ho.endInline(); served {
		info.role = singleflight.RoleOwner.String()
		info.abort = cut != nil // its own answer, cut short: not a whole one
		info.broken = cut
		return
	}
	p.respond(w, r, route, req, &source{rd: rd, ho: ho}, info)
}

// Encoded reports whether a request body has a Content-Encoding, in any of the header's
// lines or list items: identity, which says it has none, is not one. See ADR 0031.
func Encoded(h http.Header) bool {
	for e := range listItems(h, "Content-Encoding") {
		if e != "" && !strings.EqualFold(e, "identity") {
			return true
		}
	}
	return false
}

// readBody reads a request body of at most max bytes. One whose length the client gave
// (no more than max: checked before) is read into one buffer of that size, not grown; one
// of unknown length through MaxBytesReader, which also has the server close the connection
// past the bound. The buffer is not pooled: an owner function may call the upstream with
// it after this handler has returned.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength < 0 {
		return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	}
	b := make([]byte, 0, r.ContentLength+1) // +1: the read that finds the end reads into it
	for {
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > max {
			return nil, &http.MaxBytesError{Limit: max}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // more than announced: only a body not from the server
		}
	}
}

// respond writes a flight's outcome to the client as it arrives.
func (p *Proxy) respond(w http.ResponseWriter, r *http.Request, route string, req hashing.Request, rd *source, info *requestInfo) {
	ctx := r.Context()
	p.cfg.Recorder.WaitingAdd(1)
	first, err := rd.next(ctx)
	p.cfg.Recorder.WaitingAdd(-1)
	role := rd.role()
	info.role = role.String()
	if err != nil && !errors.Is(err, io.EOF) {
		p.failBeforeBytes(w, ctx, err)
		return
	}
	if ctx.Err() != nil {
		// The client left before its answer: nothing is written, and it is counted as
		// gone (see ADR 0038).
		return
	}
	head := rd.head()
	if p.cfg.Tracing != nil {
		info.origin, info.ownCall = head.Origin, rd.ho != nil && rd.ho.madeBy(head.Origin)
	}
	var age time.Duration
	if role == singleflight.RoleHit {
		age = rd.rd.Age()
	}
	sse := writeHead(w, head, role, req.Key, age)
	// A follower or a hit counts the tokens it saved, from its answer's usage: noted when
	// a stored answer was kept, else read from the end of the bytes sent. See ADR 0034.
	counted := (role == singleflight.RoleFollower || role == singleflight.RoleHit) && head.Status/100 == 2
	note, noted := head.Note.(usageNote)
	var tail *tail
	if counted && !noted {
		tail = newTail(sse)
	}
	write := func(c []byte) bool {
		if tail != nil {
			tail.add(c)
		}
		if _, err := w.Write(c); err != nil {
			return false
		}
		if sse {
			http.NewResponseController(w).Flush()
		}
		return true
	}
	ok := errors.Is(err, io.EOF) || write(first)
	for ok && !errors.Is(err, io.EOF) {
		var c []byte
		c, err = rd.next(ctx)
		switch {
		case err == nil:
			ok = write(c)
		case errors.Is(err, io.EOF):
		default:
			// Bytes of this answer are out; its rest will never come. An SSE client gets
			// an error event and a clean end, never a mix of two answers.
			if sse && ctx.Err() == nil {
				_, _ = io.WriteString(w, sseError(err))
				http.NewResponseController(w).Flush()
			}
			info.broken = err
			ok = false
			// Its own answer cut short, or a client gone: the connection is closed, so
			// that a chunked body does not end cleanly (requestInfo.abort).
			info.abort = (rd.priv && !sse) || ctx.Err() != nil
		}
	}
	if ok && counted {
		if tail != nil {
			note.prompt, note.completion = tail.usage()
		}
		p.cfg.Recorder.Saved(route, req.Model, note.prompt, note.completion)
	}
}

// writeHead sends an answer's status and headers, with its role, its key and, for a hit,
// its age; it reports whether the answer is a stream of server-sent events.
func writeHead(w http.ResponseWriter, head singleflight.Head, role singleflight.Role, key string, age time.Duration) (sse bool) {
	h := w.Header()
	for k, vs := range head.Header {
		h[k] = vs
	}
	// No slice per value, as Set would make: the role's are shared, the key and the age
	// share one array, each capped so that an append cannot reach the other.
	h[HeaderRole] = roleHeader(role)
	vals := &[2]string{key}
	h[HeaderKey] = vals[0:1:1]
	if role == singleflight.RoleHit {
		vals[1] = strconv.Itoa(int(age.Seconds()))
		h["Age"] = vals[1:2:2]
	}
	sse = isSSE(head.Header)
	if sse {
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
	}
	w.WriteHeader(head.Status)
	return sse
}

// roleValues are the values of the role header, shared by every response: nothing
// changes a header value in place.
var roleValues = [...][]string{
	singleflight.RoleUnknown:  {singleflight.RoleUnknown.String()},
	singleflight.RoleOwner:    {singleflight.RoleOwner.String()},
	singleflight.RoleFollower: {singleflight.RoleFollower.String()},
	singleflight.RoleHit:      {singleflight.RoleHit.String()},
}

func roleHeader(r singleflight.Role) []string {
	if int(r) < len(roleValues) {
		return roleValues[r][:1:1]
	}
	return []string{r.String()}
}

// shortModel is a model name as the flights listing shows it: clients choose it.
func shortModel(m string) string {
	if len(m) > 100 {
		return m[:100]
	}
	return m
}
