package singleflight

import "context"

// coordinator is what a Group does differently with Redis (remote) and in memory (memory).
// See ADR 0052.
type coordinator interface {
	// name is what Group.Backend reports.
	name() string
	// lead runs a flight no kept answer served; false when another goroutine ends it.
	lead(ctx context.Context, f *flight) bool
	// listen starts receiving other instances' purges (see purge.go).
	listen()
	// check reports whether the coordinator can be used (Group.Check).
	check(ctx context.Context) error
	// flights lists the flights in progress, unsorted (Group.Flights).
	flights(ctx context.Context, limit int) ([]FlightInfo, bool, error)
	// forget drops key's answer beyond this process; found says there was one.
	forget(ctx context.Context, key string) (found bool, err error)
	// purgeNamespace and generation keep namespace generations (see purge.go).
	purgeNamespace(ctx context.Context, ns string) (uint64, error)
	namespaceGeneration(ctx context.Context, ns string) (uint64, error)
}

var (
	_ coordinator = memory{}
	_ coordinator = (*remote)(nil)
)
