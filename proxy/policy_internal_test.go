package proxy

import (
	"net/http"
	"testing"
	"time"
)

// TestCacheControlDirectives: directives are read whatever their case, across every
// Cache-Control line, and of two max-age values the smaller wins, in either order. See ADR
// 0048.
func TestCacheControlDirectives(t *testing.T) {
	cases := []struct {
		name  string
		lines []string
		want  controls
	}{
		{"no-cache", []string{"No-Cache"}, controls{noCache: true}},
		{"no-store", []string{"NO-STORE"}, controls{noStore: true}},
		{"max-age=0 is no-cache", []string{"Max-Age=0"}, controls{noCache: true}},
		{"max-age", []string{"MAX-AGE=30"}, controls{maxAge: 30 * time.Second}},
		{"smaller max-age first", []string{"max-age=10, max-age=60"}, controls{maxAge: 10 * time.Second}},
		{"smaller max-age last", []string{"max-age=60, max-age=10"}, controls{maxAge: 10 * time.Second}},
		{"max-age on two lines", []string{"max-age=60", "Max-Age=10"}, controls{maxAge: 10 * time.Second}},
		{"quoted max-age", []string{`max-age="20"`}, controls{maxAge: 20 * time.Second}},
		{"max-age not a number", []string{"max-age=soon, max-age=5"}, controls{maxAge: 5 * time.Second}},
		{"all three", []string{"No-Store, max-age=7", "NO-CACHE"}, controls{noCache: true, noStore: true, maxAge: 7 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Cache-Control": tc.lines}
			if got := cacheControl(h); got != tc.want {
				t.Fatalf("cacheControl(%q) = %+v; want %+v", tc.lines, got, tc.want)
			}
		})
	}
}
