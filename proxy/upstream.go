package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// dropRequestHeaders are not forwarded by an owner: hop-by-hop headers, the proxy's own
// controls, Expect (the whole body is sent at once), and Accept-Encoding (the transport
// asks for gzip itself and decompresses; see ADR 0031).
var dropRequestHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Accept-Encoding",
	"Cache-Control", "Expect", HeaderBypass,
}

// replayed reports whether an upstream response header describes the response, and so is
// replayed to followers and hits: its type, the upstream's request and processing
// metadata and rate-limit hints. Never Set-Cookie, nothing about the connection.
func replayed(name string) bool {
	n := strings.ToLower(name)
	switch {
	case n == "content-type", n == "retry-after", n == "retry-after-ms", n == "x-request-id":
		return true
	case strings.HasPrefix(n, "openai-"), strings.HasPrefix(n, "x-ratelimit-"):
		return true
	}
	return false
}

// ownerFunc returns the upstream call of a flight, made with this client's request, which
// it may read after the handler returned: nothing writes the request once its body is
// read. st is how the answer may be stored; ho passes an answer too large to share to
// this client (see handoff).
func (p *Proxy) ownerFunc(route string, req hashing.Request, r *http.Request, body []byte, st storing, ho *handoff) singleflight.Func {
	key, stream := req.Key, req.Stream
	return func(ctx context.Context, w *singleflight.Writer) (singleflight.Result, error) {
		start := time.Now()
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		target := p.upstreamURL(r.URL.Path, r.URL.RawQuery)
		out, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(body))
		if err != nil {
			return failure(http.StatusBadGateway, "upstream_unavailable", "the upstream request could not be made"), err
		}
		out.Header = p.forwardHeader(r.Header)
		out.ContentLength = int64(len(body))
		call := p.startCall(ctx, r, route, req.Model, out)
		resp, err := p.cfg.Transport.RoundTrip(out)
		if err != nil {
			p.cfg.Recorder.Upstream(call.spanContext(ctx), route, 0, time.Since(start))
			p.logFailure(route, key, err)
			call.end(ctx, 0, err)
			return transportFailure(ctx, err), err
		}
		defer resp.Body.Close()
		head := singleflight.Head{Status: resp.StatusCode, Header: map[string][]string{}, Origin: call.originOf()}
		if head.Origin != "" {
			ho.setMade(head.Origin)
		}
		for k, vs := range resp.Header {
			if replayed(k) {
				head.Header[k] = vs
			}
		}
		outcome := outcomeOf(resp.StatusCode)
		if outcome == singleflight.Store && st.noStore {
			outcome = singleflight.Share
		}
		src := call.answer(resp.Body)
		tools := &toolCallScan{r: src}
		if st.noToolCalls && outcome == singleflight.Store {
			src = tools
		}
		var (
			res   singleflight.Result
			large bool
		)
		if stream && resp.StatusCode/100 == 2 && isSSE(resp.Header) {
			res, large, err = p.relay(ctx, cancel, src, w, head, route, ho)
		} else {
			res, large, err = p.readWhole(ctx, cancel, src, head, ho)
		}
		if tools.found {
			outcome = singleflight.Share
		}
		res.TTL = st.ttl
		if !large {
			// The stricter of the status policy and what reading the body found (Store <
			// Share < Retry): an incomplete stream is shared but never stored. An answer
			// too large to share is Share whatever its status: calling again would only
			// make another answer of that size.
			res.Outcome = max(res.Outcome, outcome)
		}
		code := resp.StatusCode
		if err != nil {
			code = 0
			p.logFailure(route, key, err)
		}
		p.cfg.Recorder.Upstream(call.spanContext(ctx), route, code, time.Since(start))
		call.end(ctx, code, err)
		res.Head.Origin = head.Origin
		return res, err
	}
}

// forwardHeader is what an owner sends upstream of its client's headers.
func (p *Proxy) forwardHeader(in http.Header) http.Header {
	h := in.Clone()
	for _, name := range dropRequestHeaders {
		h.Del(name)
	}
	for name := range listItems(in, "Connection") {
		h.Del(name)
	}
	if p.cfg.APIKey != "" {
		h.Set("Authorization", "Bearer "+p.cfg.APIKey)
	}
	return h
}

// logFailure logs why an upstream call of a flight failed: its waiters get a 502 or 504
// that does not say (the cause may name internal addresses).
func (p *Proxy) logFailure(route, key string, err error) {
	if len(key) > 12 {
		key = key[:12]
	}
	p.cfg.Logger.Warn("upstream call failed", "route", route, "key", key, "err", redactErr(err))
}

// readWhole reads a unary answer; the idle timeout applies between reads. Up to
// MaxResponseBytes it is the flight's answer; past that it goes to its own client only
// (large), through ho, and the flight's answer is tooLarge.
func (p *Proxy) readWhole(ctx context.Context, cancel context.CancelCauseFunc, body io.Reader, head singleflight.Head, ho *handoff) (singleflight.Result, bool, error) {
	var (
		buf bytes.Buffer
		pw  handWriter
	)
	err := p.pump(ctx, cancel, body, func(c []byte) error {
		if pw != nil {
			_, err := pw.Write(c)
			return err
		}
		if int64(buf.Len()+len(c)) <= p.cfg.MaxResponseBytes {
			buf.Write(c)
			return nil
		}
		var ok bool
		if pw, ok = ho.take(head, 0); !ok {
			return errTooLarge // nobody to give it to: stop reading
		}
		if _, err := pw.Write(buf.Bytes()); err != nil {
			return err
		}
		buf = bytes.Buffer{}
		_, err := pw.Write(c)
		return err
	})
	if pw != nil || errors.Is(err, errTooLarge) {
		if pw != nil {
			pw.CloseWithError(err) // nil: the client's answer ends here
		}
		return p.tooLarge(), true, nil
	}
	if err != nil {
		return transportFailure(ctx, err), false, err
	}
	b := buf.Bytes()
	if cap(b)-len(b) > len(b)/8 {
		// A buffer grown by doubling is kept at its length: spare capacity held for
		// ResultTTL would escape every bound on stored bytes.
		b = bytes.Clone(b)
	}
	return singleflight.Result{Head: head, Body: b}, false, nil
}

// readBuffers are the buffers upstream answers are read with, pooled: sinks copy what they
// keep.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

var (
	errIdle     = errors.New("proxy: upstream sent nothing for idle_timeout")
	errTooLarge = errors.New("proxy: upstream answer larger than the limit")
)

// pump reads body until EOF, handing each read to sink; a read that takes longer than the
// idle timeout ends the call (no zombie owner).
func (p *Proxy) pump(ctx context.Context, cancel context.CancelCauseFunc, body io.Reader, sink func([]byte) error) error {
	idle := time.AfterFunc(p.cfg.IdleTimeout, func() { cancel(errIdle) })
	defer idle.Stop()
	bp := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(bp)
	buf := *bp
	for {
		n, err := body.Read(buf)
		idle.Reset(p.cfg.IdleTimeout)
		if n > 0 {
			if serr := sink(buf[:n]); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return cause
			}
			return err
		}
	}
}
