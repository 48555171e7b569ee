package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// relay forwards a streamed (SSE) answer to the flight as it arrives. Only a stream that
// ended properly may be stored (see complete); any other is shared with this flight's
// waiters only. Past MaxResponseBytes the rest goes to its own client only (large),
// through ho, and the others' stream ends with an error event.
func (p *Proxy) relay(ctx context.Context, cancel context.CancelCauseFunc, body io.Reader, w *singleflight.Writer, head singleflight.Head, route string, ho *handoff) (singleflight.Result, bool, error) {
	w.WriteHead(head)
	end := newTail(true)
	var (
		sent  int64
		pw    handWriter
		large bool
	)
	err := p.pump(ctx, cancel, body, func(c []byte) error {
		if pw != nil {
			_, err := pw.Write(c)
			return err
		}
		if sent+int64(len(c)) > p.cfg.MaxResponseBytes {
			large = true
			var ok bool
			pw, ok = ho.take(head, sent) // before the error event, which the client never reads
			msg := "event: error\ndata: " + string(errorJSON("upstream_error", "upstream_too_large", p.tooLargeMessage())) + "\n\n"
			if _, err := w.Write([]byte(msg)); err != nil || !ok {
				return errTooLarge // nobody to give the rest to: stop reading
			}
			_, err := pw.Write(c)
			return err
		}
		sent += int64(len(c))
		end.add(bytes.Clone(c)) // c is the read buffer, reused by the next read
		_, err := w.Write(c)
		return err
	})
	if large {
		if pw != nil {
			pw.CloseWithError(err)
		}
		return singleflight.Result{Outcome: singleflight.Share}, true, nil
	}
	if err != nil {
		return transportFailure(ctx, err), false, err
	}
	res := singleflight.Result{Outcome: singleflight.Store}
	if !complete(route, end) {
		res.Outcome = singleflight.Share
	}
	return res, false, nil
}

// complete reports whether a stream ended as its API ends a whole answer: "data: [DONE]"
// for Chat Completions and Completions; a last event response.completed for the Responses
// API. On any other route a stream is never known to be whole. See ADR 0033.
func complete(route string, t *tail) bool {
	switch {
	case strings.HasSuffix(route, "/completions"):
		return t.endsWithDone()
	case strings.HasSuffix(route, "/responses"):
		return t.lastEvent() == "response.completed"
	}
	return false
}

// sseError is the event that ends a stream an error interrupted mid-answer: the owner's
// call changed (ErrGenerationChanged), or it ended with nobody to take it over.
func sseError(err error) string {
	msg := "the answer was interrupted: the upstream call streaming it stopped; retry the request"
	if !errors.Is(err, singleflight.ErrGenerationChanged) {
		msg = "the answer was interrupted; retry the request"
	}
	return "event: error\ndata: " + string(errorJSON("server_error", "stream_interrupted", msg)) + "\n\n"
}

// isSSE reports whether a head's Content-Type is a stream of server-sent events.
func isSSE(h map[string][]string) bool {
	for _, v := range h["Content-Type"] {
		if strings.HasPrefix(strings.ToLower(v), "text/event-stream") {
			return true
		}
	}
	return false
}
