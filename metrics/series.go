package metrics

import (
	"maps"
	"sync"
	"sync/atomic"
)

// series keeps the children of metric vectors by a comparable key, so that a method called
// on every request finds its series with one map lookup: a vector's WithLabelValues hashes
// the label values, takes a read lock and compares the values on every call, and
// strconv.Itoa of a status code allocates. The map is replaced, never changed, so readers
// take no lock; a new key copies it, which is rare, because keys come from the bounded sets
// the label values come from (see the package documentation). Children are made as the
// vectors would make them, when first used, so that /metrics shows the same series.
type series[K comparable, V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

// get returns k's children, made by resolve the first time.
func (s *series[K, V]) get(k K, resolve func(K) V) V {
	if m := s.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	next := make(map[K]V, 1)
	if old != nil {
		next = maps.Clone(*old)
	}
	v := resolve(k)
	next[k] = v
	s.m.Store(&next)
	return v
}
