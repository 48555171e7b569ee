package singleflight

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Writer is an owner's output: what it writes reaches local readers at once and remote
// followers in batches (Options.BatchDelay, Options.BatchBytes), fenced by the owner's
// token. It is safe for use by one goroutine at a time.
type Writer struct {
	g      *Group
	f      *flight
	o      ownership
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	head     *Head
	headSent bool
	pending  []byte
	all      [][]byte // everything written, for the stored transcript
	n        int      // batches appended
	err      error    // ErrLeaseLost once a write was fenced
	closed   bool
	wake     chan struct{}
	done     chan struct{}
}

// WriteHead sets the status and headers of a streamed response. It must come before Write.
func (w *Writer) WriteHead(h Head) {
	w.mu.Lock()
	if w.head == nil {
		w.head = &h
	}
	w.mu.Unlock()
	w.f.setHead(h)
}

// Write appends p (copied) to the response. It fails with ErrLeaseLost once another owner
// has taken over: the caller should stop, its flight context is cancelled too.
func (w *Writer) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return 0, err
	}
	if w.head == nil {
		w.mu.Unlock()
		return 0, errors.New("singleflight: Write before WriteHead")
	}
	c := append([]byte(nil), p...)
	w.all = append(w.all, c)
	remote := w.o.remote()
	if remote {
		w.pending = append(w.pending, c...)
	}
	w.mu.Unlock()
	w.f.appendChunk(c)
	if remote {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// takePending returns the bytes no batch has carried yet.
func (w *Writer) takePending() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = nil
	return p
}

// transcript is everything written plus the final body.
func (w *Writer) transcript(body []byte) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.all) == 0 {
		return body
	}
	n := len(body)
	for _, c := range w.all {
		n += len(c)
	}
	t := make([]byte, 0, n)
	for _, c := range w.all {
		t = append(t, c...)
	}
	return append(t, body...)
}

// flushLoop sends pending bytes as batches until the Writer is closed, then once more.
// A write after a quiet spell goes out at once (the first token is not delayed); writes
// that follow within BatchDelay of a flush are collected into the next batch, unless it
// already holds BatchBytes.
func (w *Writer) flushLoop() {
	var last time.Time
	for {
		select {
		case <-w.wake:
		case <-w.done:
			w.flush()
			return
		}
		if wait := w.g.opts.BatchDelay - time.Since(last); wait > 0 && w.pendingLen() < w.g.opts.BatchBytes {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-w.done:
				t.Stop()
			}
		}
		last = time.Now()
		if !w.flush() {
			return
		}
	}
}

func (w *Writer) pendingLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// flush appends the pending bytes as one batch; false when the Writer must stop.
func (w *Writer) flush() bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	if len(w.pending) == 0 {
		w.mu.Unlock()
		return true
	}
	data := w.pending
	w.pending = nil
	var head *Head
	if !w.headSent {
		head = w.head
	}
	n := w.n + 1
	w.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), writeTimeout(w.g))
	err := w.o.appendBatch(ctx, n, head, data)
	cancel()

	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.n, w.headSent = n, true
		return true
	case errors.Is(err, ErrLeaseLost):
		w.err = ErrLeaseLost
		w.g.observe(Event{Kind: EventFencedWrite, Key: w.f.key, Op: "append"})
		w.cancel(ErrLeaseLost)
		return false
	default:
		// Keep the bytes for the next batch: batch numbers make a retried append
		// harmless, and followers detect a gap rather than read a hole.
		w.pending = append(data, w.pending...)
		return true
	}
}

// closeAndFlush ends the Writer; the flush loop sends what is pending and stops.
func (w *Writer) closeAndFlush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}
