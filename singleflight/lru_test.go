package singleflight

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestLRUBoundedInBytes: the answers kept in the process are bounded in bytes, not only
// in count: large answers evict the least recently used ones, and the heap stays within
// the bound whatever the answers' sizes.
func TestLRUBoundedInBytes(t *testing.T) {
	const (
		answer = 1 << 20
		bound  = 8 << 20
		n      = 48
	)
	g := backend{name: "memory"}.group(t, Options{ResultTTL: time.Minute, MemoryMaxBytes: bound})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uniqueKey()
		rp := newReply(strings.Repeat(string(rune('a'+i%26)), answer))
		rp.release()
		doAll(t, g, keys[i], 1, rp.fn)()
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 2*bound {
		t.Errorf("the heap grew by %d MiB for %d answers of 1 MiB; want at most about the %d MiB bound",
			grown>>20, n, bound>>20)
	}
	// The last answers are served from memory; the first were evicted.
	last := newReply("again")
	last.release()
	if o := doAll(t, g, keys[n-1], 1, last.fn)()[0]; o.role != RoleHit || len(o.body) != answer {
		t.Errorf("newest answer: role %v, %d bytes; want a hit of %d bytes", o.role, len(o.body), answer)
	}
	if o := doAll(t, g, keys[0], 1, last.fn)()[0]; o.role != RoleOwner {
		t.Errorf("oldest answer: role %v; want owner (evicted to stay within %d bytes)", o.role, bound)
	}
}

func TestLRUEviction(t *testing.T) {
	s := newLRU(3, 100)
	add := func(k string, size int) { s.add(k, storedResult{body: make([]byte, size)}) }
	add("a", 40)
	add("b", 40)
	if _, ok := s.get("a"); !ok { // a is now the most recently used
		t.Fatal("a: not kept")
	}
	add("c", 40) // 120 > 100: b, the least recently used, goes
	if _, ok := s.get("b"); ok {
		t.Error("b kept; want it evicted by size")
	}
	add("big", 101) // larger than the whole bound: not kept, nothing evicted for it
	if _, ok := s.get("big"); ok {
		t.Error("an answer larger than the bound was kept")
	}
	if _, ok := s.get("a"); !ok {
		t.Error("a evicted for an answer that could never fit")
	}
	add("d", 1)
	add("e", 1) // four entries > 3: the least recently used (c) goes
	if _, ok := s.get("c"); ok {
		t.Error("c kept; want it evicted by count")
	}
	add("a", 10) // replaces a, and its size
	if s.bytes != 10+1+1+int64(len("a")+len("d")+len("e")) {
		t.Errorf("bytes %d after replacing a; want the sizes of a, d and e", s.bytes)
	}
	s.remove("a")
	if _, ok := s.get("a"); ok || s.len() != 2 {
		t.Errorf("after remove: a kept %v, %d entries; want gone, 2", ok, s.len())
	}
}
