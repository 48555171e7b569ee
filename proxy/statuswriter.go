package proxy

import (
	"bufio"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// statusWriter is the client's writer, kept in the request's state. It records the
// answer's status for its log line and metrics: an informational status (1xx but 101) is
// passed on without being taken for it, only the first other one is passed on, a Write or
// a flush before any WriteHeader is a 200, and a hijack (an upgrade) a 101. The rest of
// the server's writer is reached through Unwrap, as http.ResponseController does.
//
// While the proxy drains, the status line gets Connection: close, added as the status is
// written so that an answer begun before the drain closes its connection too. See ADR
// 0040.
//
// Each write and flush gives the connection SendTimeout to take the bytes: a client that
// stops reading cannot hold its connection and answer forever. See ADR 0036.
type statusWriter struct {
	http.ResponseWriter
	status   int
	draining *atomic.Bool
	send     time.Duration
}

// What http.ResponseController and the reverse proxy look for in the writer.
var _ interface {
	http.ResponseWriter
	http.Hijacker
	FlushError() error
	Unwrap() http.ResponseWriter
} = (*statusWriter)(nil)

func (w *statusWriter) WriteHeader(code int) {
	switch {
	case code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols:
		w.ResponseWriter.WriteHeader(code)
	case w.status == 0:
		w.status = code
		if w.draining != nil && w.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.send <= 0 {
		return w.ResponseWriter.Write(b)
	}
	// A connection's deadline bounds a whole write: a large answer (a unary one is one
	// Write) goes in pieces, each given SendTimeout, so that a client reading steadily but
	// slowly is not cut off.
	n := 0
	for {
		piece := b[n:min(len(b), n+sendPiece)]
		w.deadline()
		k, err := w.ResponseWriter.Write(piece)
		n += k
		if err != nil || n == len(b) {
			return n, err
		}
	}
}

// sendPiece is the most written to the client under one deadline.
const sendPiece = 64 << 10

// deadline gives the next write to the client SendTimeout to make progress. The server
// lifts it once the answer is written, before it reads the connection's next request.
func (w *statusWriter) deadline() {
	if w.send > 0 {
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.send))
	}
}

// FlushError is how http.ResponseController flushes: the server's writer's flush, after
// the header.
func (w *statusWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.deadline()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over: the reverse proxy does for an upgrade, once the
// upstream has answered 101, which it then writes on the connection itself. The answer
// is taken for that 101.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}
