package proxy

import (
	"bytes"
	"context"
	"io"
	"strings"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// relay forwards a streamed (SSE) answer to the flight as it arrives: local readers get
// each read at once, followers elsewhere in batches. Only a stream that ended properly may
// be stored (see complete); any other is shared with this flight's waiters only.
func (p *Proxy) relay(ctx context.Context, cancel context.CancelCauseFunc, body io.Reader, w *singleflight.Writer, head singleflight.Head, route string) (singleflight.Result, error) {
	w.WriteHead(head)
	end := newTail(true)
	err := p.pump(ctx, cancel, body, func(c []byte) error {
		end.add(bytes.Clone(c)) // c is the read buffer, reused by the next read
		_, err := w.Write(c)
		return err
	})
	if err != nil {
		return transportFailure(ctx, err), err
	}
	res := singleflight.Result{Outcome: singleflight.Store}
	if !complete(route, end) {
		res.Outcome = singleflight.Share
	}
	return res, nil
}

// complete reports whether a stream ended as its API ends a whole answer: "data: [DONE]"
// for Chat Completions and Completions; a last event response.completed for the Responses
// API (not response.failed or response.incomplete). On any other route a stream is never
// known to be whole.
func complete(route string, t *tail) bool {
	switch {
	case strings.HasSuffix(route, "/completions"):
		return t.endsWithDone()
	case strings.HasSuffix(route, "/responses"):
		return t.lastEvent() == "response.completed"
	}
	return false
}
