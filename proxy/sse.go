package proxy

import (
	"context"
	"io"
	"strings"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// relay forwards a streamed (SSE) answer to the flight as it arrives: local readers get
// each read at once, followers elsewhere in batches. Only a stream that ended properly may
// be stored: for the Chat Completions and Completions APIs the upstream's last event is
// "data: [DONE]"; for other routes (the Responses API ends with its response.completed
// event, forwarded verbatim) a clean end of the body.
func (p *Proxy) relay(ctx context.Context, cancel context.CancelCauseFunc, body io.Reader, w *singleflight.Writer, head singleflight.Head, route string) (singleflight.Result, error) {
	w.WriteHead(head)
	end := newTail(true)
	err := p.pump(ctx, cancel, body, func(c []byte) error {
		end.add(c)
		_, err := w.Write(c)
		return err
	})
	if err != nil {
		return transportFailure(ctx, err), err
	}
	res := singleflight.Result{Outcome: singleflight.Store}
	if needsDone(route) && !end.endsWithDone() {
		res.Outcome = singleflight.Share
	}
	return res, nil
}

func needsDone(route string) bool {
	return strings.HasSuffix(route, "/completions")
}
