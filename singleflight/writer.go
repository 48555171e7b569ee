package singleflight

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Writer is an owner's output: local readers get it at once, remote followers in fenced
// batches. It is safe for use by one goroutine at a time, the owner function's; its
// flushLoop goroutine (from the first Write) shares the fields below mu under it.
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
	inflight *batch   // a batch whose append failed: retried first
	full     bool     // the stream is at its cap: the rest goes with the final write
	err      error    // ErrLeaseLost once a write was fenced
	closed   bool
	wake     chan struct{}
	done     chan struct{}
	// flusher runs flushLoop from a remote owner's first Write: a unary answer needs none.
	flusher   sync.WaitGroup
	flushOnce sync.Once
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
// has taken over, and the flight context is cancelled.
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
	shared := w.o.shared()
	if shared {
		w.pending = append(w.pending, c...)
	}
	w.mu.Unlock()
	w.f.appendChunk(c)
	if shared {
		w.flushOnce.Do(func() { w.flusher.Go(w.flushLoop) })
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

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

// flushLoop sends pending bytes as batches until the Writer is closed, then once more: at
// once after a quiet spell, else BatchDelay after the last flush (ADR 0017).
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

// batch is one append: its number, the head if it carries it, and its bytes. A failed
// batch is retried as it was, before anything newer (ADR 0004).
type batch struct {
	n    int
	head *Head
	data []byte
}

// flush appends the failed batch, then the pending bytes; false when the Writer must stop.
func (w *Writer) flush() bool {
	for {
		w.mu.Lock()
		if w.err != nil || w.full {
			w.mu.Unlock()
			return false
		}
		if w.closed && w.o.unusable() {
			w.mu.Unlock()
			return true // what is left goes with the final write (ADR 0056)
		}
		b := w.inflight
		if b == nil {
			if len(w.pending) == 0 {
				w.mu.Unlock()
				return true
			}
			b = &batch{n: w.n + 1, data: w.pending}
			if !w.headSent {
				b.head = w.head
			}
			w.pending = nil
			w.inflight = b
		}
		w.mu.Unlock()

		err := w.o.appendBatch(context.WithoutCancel(w.ctx), b.n, b.head, b.data)

		w.mu.Lock()
		switch {
		case err == nil:
			w.n, w.inflight = b.n, nil
			w.headSent = w.headSent || b.head != nil
			w.mu.Unlock()
			continue
		case errors.Is(err, errStreamFull), errors.Is(err, ErrFlightGone):
			// The rest goes with the final write (ADRs 0005, 0011).
			w.full = true
			w.pending = append(b.data, w.pending...)
			w.inflight = nil
			w.mu.Unlock()
			if errors.Is(err, ErrFlightGone) {
				w.g.writeEnded(w.o, w.f.key, "append", err)
			}
			return false
		case errors.Is(err, ErrLeaseLost):
			w.err = ErrLeaseLost
			w.mu.Unlock()
			w.g.writeEnded(w.o, w.f.key, "append", err)
			w.cancel(ErrLeaseLost)
			return false
		}
		w.mu.Unlock()
		return true // kept in inflight: the next flush retries it
	}
}

// tail returns the failed batch, which may have landed, then the pending bytes. If the
// flight's batch count reached landedN, its first skip bytes are not sent again.
func (w *Writer) tail() (data []byte, landedN, skip int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight != nil {
		data = append(data, w.inflight.data...)
		landedN, skip = w.inflight.n, len(w.inflight.data)
	}
	data = append(data, w.pending...)
	w.inflight, w.pending = nil, nil
	return data, landedN, skip
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
