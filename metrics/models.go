package metrics

import (
	"sync"
	"unicode/utf8"
)

// modelSet caps the distinct model label values; see MaxModels.
type modelSet struct {
	max  int
	mu   sync.RWMutex
	seen map[string]struct{}
}

// label returns the label value to use for model.
func (s *modelSet) label(model string) string {
	if model == "" {
		return modelUnknown
	}
	if len(model) > MaxModelBytes || !utf8.ValidString(model) {
		return modelOther // not a model name anyone deploys, and no label value to keep
	}
	s.mu.RLock()
	_, ok := s.seen[model]
	n := len(s.seen)
	s.mu.RUnlock()
	if ok {
		return model
	}
	if n >= s.max {
		return modelOther
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[model]; ok {
		return model
	}
	if len(s.seen) >= s.max {
		return modelOther
	}
	if s.seen == nil {
		s.seen = make(map[string]struct{})
	}
	s.seen[model] = struct{}{}
	return model
}
