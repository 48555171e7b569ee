package singleflight

import (
	"context"
	"sync"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/poll"
)

// A local flight that followed takes its mark off the flight's meta once its lead ends
// without the answer (ADR 0074). A mark comes off whatever Redis was doing then: one Redis
// did not answer is sent again once its shard can be asked, and a lead that ends because
// the Group closes sends its own before the Group is closed. Only an instance that dies, or
// closes while Redis cannot be asked, leaves its marks: its callers may still wait for all
// Redis can tell, and the call finishes.

// unwaitReq is one mark to take off.
type unwaitReq struct {
	key    string
	mark   string // "<instance>:<local flight>"
	finish bool   // one of its callers asked that the call finish
}

// unwaits holds the marks Redis did not take off yet, and sends them again.
type unwaits struct {
	mu      sync.Mutex
	pending map[string]unwaitReq // by mark
	running bool                 // resend runs
}

// unwait takes f's mark off the flight it followed, once its lead ended without the answer.
func (r *remote) unwait(f *flight) {
	f.mu.Lock()
	u := unwaitReq{key: f.key, mark: r.markOf(f), finish: f.finishAll}
	f.mu.Unlock()
	if r.g.hooks.unwaiting != nil {
		r.g.hooks.unwaiting(false)
		defer r.g.hooks.unwaiting(true)
	}
	if !r.sendUnwait(u) {
		r.keepUnwait(u)
	}
}

// sendUnwait runs unwait.lua for u, within one Redis deadline even while the Group closes;
// false when Redis could not be asked or did not answer.
func (r *remote) sendUnwait(u unwaitReq) bool {
	if r.unusable(u.key) {
		return false
	}
	k := r.keys(u.key)
	ctx, cancel := r.watchedOp(context.WithoutCancel(r.g.ctx), k.meta)
	defer cancel()
	err := unwaitScript.Run(ctx, r.rdb, []string{k.meta}, u.mark, flag(u.finish)).Err()
	if err != nil {
		_ = r.redisErr("unwait", u.key, err)
	}
	return err == nil
}

// keepUnwait keeps u to be sent again, and starts resend if it is not running.
func (r *remote) keepUnwait(u unwaitReq) {
	q := &r.unwaits
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending == nil {
		q.pending = map[string]unwaitReq{}
	}
	q.pending[u.mark] = u
	if q.running || !r.g.counted() {
		return
	}
	q.running = true
	go r.resend()
}

// unwaitRetry is how often the kept marks are sent again.
const unwaitRetry = poll.Every

// resend sends the kept marks again every unwaitRetry, each once its shard can be asked,
// until none is left; a closing Group tries each once more and ends.
func (r *remote) resend() {
	defer r.g.wg.Done()
	q := &r.unwaits
	for {
		closing := !sleep(r.g.ctx, unwaitRetry)
		q.mu.Lock()
		batch := make([]unwaitReq, 0, len(q.pending))
		for _, u := range q.pending {
			batch = append(batch, u)
		}
		q.mu.Unlock()
		for _, u := range batch {
			if r.sendUnwait(u) || closing {
				q.mu.Lock()
				delete(q.pending, u.mark)
				q.mu.Unlock()
			}
		}
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}
