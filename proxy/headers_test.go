package proxy

import (
	"net/http"
	"slices"
	"testing"
)

// TestListItemsReadsEveryLine: a list header's items are read across all its lines, each
// trimmed, empty ones included, as its readers (Connection, Content-Encoding,
// Cache-Control) need.
func TestListItemsReadsEveryLine(t *testing.T) {
	h := http.Header{"Connection": {" keep-alive, X-Hop ", "upgrade,,close"}}
	got := slices.Collect(listItems(h, "Connection"))
	want := []string{"keep-alive", "X-Hop", "upgrade", "", "close"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q; want %q", got, want)
	}
	for item := range listItems(h, "Connection") {
		if item != "keep-alive" {
			t.Fatalf("after stopping, got %q", item)
		}
		break
	}
	if got := slices.Collect(listItems(h, "Missing")); len(got) != 0 {
		t.Fatalf("a missing header yielded %q; want nothing", got)
	}
}
