package singleflight

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRetryThenSuccess(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			gate := make(chan struct{})
			calls := 0
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				calls++
				<-gate
				if calls == 1 {
					return Result{Head: Head{Status: 500}, Body: []byte("boom"), Outcome: Retry}, nil
				}
				return Result{Head: Head{Status: 200}, Body: []byte("ok")}, nil
			}
			wait := doAll(t, g, key, 5, fn)
			close(gate)
			outs := wait()
			// The starter gets its own upstream answer; the others get the retry's.
			if outs[0].head.Status != 500 || outs[0].body != "boom" {
				t.Fatalf("starter: got (%d, %q); want its own (500, boom)", outs[0].head.Status, outs[0].body)
			}
			for i, o := range outs[1:] {
				if o.err != nil || o.head.Status != 200 || o.body != "ok" {
					t.Fatalf("caller %d: got (%d, %q, %v); want (200, ok)", i+1, o.head.Status, o.body, o.err)
				}
			}
			if calls != 2 {
				t.Fatalf("%d calls; want 2", calls)
			}
		})
	}
}

// TestInlineOwnerGetsItsOwnFailureAtOnce: a caller leading its flight on its own goroutine
// (CallOptions.Inline) whose call fails while others wait with it gets that failed answer
// as soon as its call ends: the retries for the others run on a goroutine of their own,
// not before DoWith returns. And it keeps its own answer when the retries fail too, read
// however late.
func TestInlineOwnerGetsItsOwnFailureAtOnce(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{MaxAttempts: 3})
			key := uniqueKey()
			first, retries := make(chan struct{}), make(chan struct{})
			var opened sync.Once
			openRetries := func() { opened.Do(func() { close(retries) }) }
			defer openRetries() // a failed test does not leave the retry hanging
			running := make(chan int, 3)
			var calls atomic.Int32
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				n := int(calls.Add(1))
				running <- n
				gate := retries
				if n == 1 {
					gate = first
				}
				select {
				case <-gate:
				case <-ctx.Done():
					return Result{}, context.Cause(ctx)
				}
				body := []byte("call " + strconv.Itoa(n))
				return Result{Head: Head{Status: 500}, Body: body, Outcome: Retry}, nil
			}
			led := doAsync(t, g, key, CallOptions{Inline: true}, fn)
			if n := <-running; n != 1 {
				t.Fatalf("call %d ran first", n)
			}
			wait := doAll(t, g, key, 3, fn) // they join the call in flight
			close(first)
			if n := <-running; n != 2 {
				t.Fatalf("call %d ran second", n)
			}
			var starter *Reader
			select {
			case starter = <-led:
			case <-time.After(5 * time.Second):
				t.Fatal("the inline caller is still leading while the retry for the others runs")
			}
			openRetries()
			for i, o := range wait() {
				if o.head.Status != 500 || o.body != "call 3" {
					t.Errorf("waiter %d: got (%d, %q, %v); want the last attempt's (500, call 3)", i, o.head.Status, o.body, o.err)
				}
			}
			o := readAll(context.Background(), starter)
			if o.err != nil || o.head.Status != 500 || o.body != "call 1" || o.role != RoleOwner {
				t.Fatalf("inline caller: got (%d, %q, %v, %v); want its own call's (500, call 1) as owner", o.head.Status, o.body, o.role, o.err)
			}
			if n := calls.Load(); n != 3 {
				t.Fatalf("%d calls; want MaxAttempts = 3", n)
			}
		})
	}
}
