package singleflight

import "container/list"

// lruCache is the in-process cache of answers: an LRU bounded in entries and in bytes (ADR 0028).
// Group holds cacheMu around it.
type lruCache struct {
	maxEntries int
	maxBytes   int64
	bytes      int64
	order      *list.List // of *lruEntry, most recently used first
	items      map[string]*list.Element
}

type lruEntry struct {
	key  string
	sr   storedResult
	size int64
}

func newLRU(maxEntries int, maxBytes int64) *lruCache {
	return &lruCache{maxEntries: maxEntries, maxBytes: maxBytes, order: list.New(), items: map[string]*list.Element{}}
}

// sizeOf is what an entry counts against maxBytes: its key, body and headers.
func sizeOf(key string, sr storedResult) int64 {
	n := len(key) + len(sr.body)
	for k, vs := range sr.head.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return int64(n)
}

// add keeps sr and evicts the least recently used until both bounds hold; a result
// larger than maxBytes is not kept.
func (s *lruCache) add(key string, sr storedResult) {
	size := sizeOf(key, sr)
	s.remove(key)
	if size > s.maxBytes {
		return
	}
	s.items[key] = s.order.PushFront(&lruEntry{key: key, sr: sr, size: size})
	s.bytes += size
	for s.order.Len() > s.maxEntries || s.bytes > s.maxBytes {
		s.removeElement(s.order.Back())
	}
}

// get returns key's entry and marks it most recently used.
func (s *lruCache) get(key string) (storedResult, bool) {
	e, ok := s.items[key]
	if !ok {
		return storedResult{}, false
	}
	s.order.MoveToFront(e)
	return e.Value.(*lruEntry).sr, true
}

func (s *lruCache) remove(key string) {
	if e, ok := s.items[key]; ok {
		s.removeElement(e)
	}
}

func (s *lruCache) removeElement(e *list.Element) {
	se := s.order.Remove(e).(*lruEntry)
	delete(s.items, se.key)
	s.bytes -= se.size
}

func (s *lruCache) len() int { return s.order.Len() }

func (s *lruCache) clear() {
	s.order.Init()
	clear(s.items)
	s.bytes = 0
}
