package singleflight

import (
	"context"
	"testing"
)

// rem is the Redis coordinator of a Group made with Options.Redis.
func (g *Group) rem() *remote { return g.coord.(*remote) }

func TestBackendNamesItsCoordinator(t *testing.T) {
	for _, b := range backends(t) {
		g := b.group(t, Options{})
		if got := g.Backend(); got != b.name {
			t.Errorf("Backend() = %q; want %q", got, b.name)
		}
		if err := g.Check(context.Background()); err != nil {
			t.Errorf("%s: Check() = %v; want nil", b.name, err)
		}
	}
}
