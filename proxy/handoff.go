package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// An answer larger than MaxResponseBytes is not shared: past the limit, the owner function
// hands the rest to the client whose request made the call, outside the flight, at that
// client's pace; everyone else's flight ends with an error (Outcome Share: never retried,
// never stored). See ADR 0035.

// errClientGone ends a handoff whose client stopped reading.
var errClientGone = errors.New("proxy: the client of the call left")

// handoff passes an answer too large to share from an owner function to the handler of the
// client whose request it was made with. The handler readies the one in its request's
// state (its wait's context set) before Do and closes it when it returns; the owner
// function takes it at most once.
type handoff struct {
	mu     sync.Mutex
	closed bool // the handler reads no more
	taken  bool
	wait   waitCtx // the handler waits on the flight with it; a handoff ends it
	shared int64   // bytes the handler reads from the flight before the pipe
	head   singleflight.Head
	pr     *io.PipeReader

	// While the handler runs its own flight's call (a unary request's, see
	// singleflight.CallOptions.Inline), it cannot read a pipe: for that time inlineW is its
	// client, which a handoff writes to directly, and inlineKey its request's key. done is
	// made when a handoff uses it, and closed, with cut set, when the answer has been
	// written or was cut short.
	inlineW   http.ResponseWriter
	inlineKey string
	done      chan struct{}
	cut       error

	// made is the origin of the last call this request's function made (ADR 0061): an
	// answer of another origin came from another request's call.
	made string
}

// setMade records the origin of a call of this request's function.
func (h *handoff) setMade(origin string) {
	h.mu.Lock()
	h.made = origin
	h.mu.Unlock()
}

// madeBy reports whether origin is a call of this request's function.
func (h *handoff) madeBy(origin string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return origin != "" && origin == h.made
}

// handWriter is where an owner function writes an answer it hands over.
type handWriter interface {
	io.Writer
	CloseWithError(error) error
}

var (
	_ handWriter = (*inlineWriter)(nil)
	_ handWriter = (*io.PipeWriter)(nil)
)

// take hands the rest of the answer over: the client has been given, or will be given,
// shared bytes of it from the flight, and reads the rest from the returned writer. false
// when its handler reads no more (its client left, or it was already answered).
func (h *handoff) take(head singleflight.Head, shared int64) (handWriter, bool) {
	h.mu.Lock()
	if h.closed || h.taken {
		h.mu.Unlock()
		return nil, false
	}
	if w := h.inlineW; w != nil {
		h.taken, h.head, h.done = true, head, make(chan struct{})
		h.mu.Unlock()
		writeHead(w, head, singleflight.RoleOwner, h.inlineKey, 0)
		return &inlineWriter{h: h, w: w}, true
	}
	defer h.mu.Unlock()
	pr, pw := io.Pipe()
	h.taken, h.head, h.shared, h.pr = true, head, shared, pr
	h.wait.wake()
	return pw, true
}

// inlineWriter writes a handed-over answer straight to the client.
type inlineWriter struct {
	h *handoff
	w io.Writer
}

func (iw *inlineWriter) Write(p []byte) (int, error) { return iw.w.Write(p) }

func (iw *inlineWriter) CloseWithError(err error) error {
	iw.h.mu.Lock()
	defer iw.h.mu.Unlock()
	iw.h.cut = err
	close(iw.h.done)
	return nil
}

// endInline ends the handler's own run of its call: from now on a handoff goes through the
// pipe. It reports whether the answer was written inline, waiting until it has been (a
// takeover can run the call on another goroutine just as the run ends), and whether it
// was cut short.
func (h *handoff) endInline() (served bool, cut error) {
	h.mu.Lock()
	h.inlineW = nil
	done := h.done
	h.mu.Unlock()
	if done == nil {
		return false, nil
	}
	<-done
	h.mu.Lock()
	defer h.mu.Unlock()
	return true, h.cut
}

// isTaken reports whether the owner function handed the answer over.
func (h *handoff) isTaken() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.taken
}

// close says the handler reads no more; an owner function writing to the pipe stops.
func (h *handoff) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.pr != nil {
		h.pr.CloseWithError(errClientGone)
	}
	h.wait.release()
}

// source is what a handler reads its answer from: the flight, and after a handoff the
// pipe.
type source struct {
	rd   *singleflight.Reader
	ho   *handoff
	got  int64 // bytes read from the flight
	priv bool  // reading the pipe
	buf  []byte
}

// next returns the next chunk of the answer, or io.EOF after the last.
func (s *source) next(ctx context.Context) ([]byte, error) {
	if !s.priv {
		c, err := s.rd.Next(&s.ho.wait)
		if ctx.Err() != nil || !s.ho.isTaken() || (err == nil && s.got+int64(len(c)) <= s.ho.shared) {
			s.got += int64(len(c))
			return c, err
		}
		s.priv = true // what the flight holds next is for the others
		s.buf = make([]byte, 32<<10)
	}
	n, err := s.ho.pr.Read(s.buf)
	if n > 0 {
		return s.buf[:n], nil
	}
	return nil, err
}

// head and role of the answer being read: the flight's, or the handoff's when nothing of
// it came from the flight.
func (s *source) head() singleflight.Head {
	if s.priv && s.got == 0 {
		return s.ho.head
	}
	return s.rd.Head()
}

func (s *source) role() singleflight.Role {
	if s.priv && s.got == 0 {
		return singleflight.RoleOwner
	}
	return s.rd.Role()
}

// tooLargeMessage explains to the requests waiting with the owner's why they get no answer.
func (p *Proxy) tooLargeMessage() string {
	return "the upstream answer is larger than " + strconv.FormatInt(p.cfg.MaxResponseBytes, 10) +
		" bytes, the most the proxy shares; it went to the request that made the call only. " +
		"Send the request again with the header X-Dedupe-Bypass: 1 to get it"
}

// tooLarge is the outcome of a flight whose answer is too large to share: an error for
// every other waiter, shared at once, never retried.
func (p *Proxy) tooLarge() singleflight.Result {
	return singleflight.Result{
		Head:    singleflight.Head{Status: http.StatusBadGateway, Header: map[string][]string{"Content-Type": {"application/json"}}},
		Body:    append(errorJSON("upstream_error", "upstream_too_large", p.tooLargeMessage()), '\n'),
		Outcome: singleflight.Share,
	}
}
