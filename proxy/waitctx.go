package proxy

import (
	"context"
	"sync"
)

// waitCtx is what a handler waits on its flight with: the request's context, also ended
// by a handoff. The cancelable context behind it is made by the first call that needs it,
// since most readers (hits) never wait; once made, it is that context in every respect.
type waitCtx struct {
	context.Context // the request's; Deadline is its

	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	woken  bool
}

var _ context.Context = (*waitCtx)(nil)

func (c *waitCtx) get() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		c.ctx, c.cancel = context.WithCancel(c.Context)
		if c.woken {
			c.cancel()
		}
	}
	return c.ctx
}

func (c *waitCtx) Done() <-chan struct{} { return c.get().Done() }
func (c *waitCtx) Err() error            { return c.get().Err() }
func (c *waitCtx) Value(key any) any     { return c.get().Value(key) } // context.Cause finds the cancelable one

// wake ends the wait, or the one to come.
func (c *waitCtx) wake() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.woken = true
	if c.cancel != nil {
		c.cancel()
	}
}

// release frees the context, as its cancel function does, when the handler returns.
func (c *waitCtx) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
}
