// Package sim runs the protocol of package singleflight under a virtual clock: several
// instances, each a real singleflight.Group with a real go-redis client, over an in-memory
// network to a Redis stand-in that runs the project's own Lua scripts, with an upstream
// and clients of its own, all in one testing/synctest bubble. Ten virtual minutes take
// milliseconds, a seed draws a workload and a schedule of faults, and every run is checked
// against the protocol's invariants. Everything is in its tests; this file is its guide.
//
// # What it holds
//
//   - net_test.go: the network. A link from an instance to a Redis address is up, holds
//     bytes (a paused peer), is cut (a partition), refuses, or is dead (a killed process);
//     faults overlap and the most severe decides.
//   - redis_test.go: the stand-in. Each server is a miniredis (gopher-lua runs the
//     scripts) on the bubble's clock; a Cluster is several, with its slot map and a bus
//     that carries every PUBLISH to all. A restart comes back from a snapshot.
//   - conformance_test.go: the stand-in judged by a real redis-server, script by script
//     and branch by branch, and every command the project sends held to that list.
//   - world_test.go, upstream_test.go, fault_test.go: instances, clients (streamed or
//     unary, leaving, coming back, no-cache, no-store, finish), the upstream (each call
//     numbered, its chunks naming it), and the faults.
//   - history_test.go, commands_test.go: what happened, when, on which instance, and the
//     file:function of the project's code that made it.
//   - check_test.go: the invariants. explore_test.go, schedule_test.go: seeded runs.
//   - story_test.go, stories_test.go: the stories, golden timelines in testdata/stories.
//
// # Running it
//
//	go test ./singleflight/sim                                   # stories, conformance, 64 seeds
//	go test ./singleflight/sim -run TestStories -update          # rewrite the stories
//	go test ./singleflight/sim -run TestExplore -args -sim.seeds=20000 -sim.first=1
//	go test ./singleflight/sim -run TestExplore -v -args -sim.seed=1610   # one seed's timeline
//	go test ./singleflight/sim -run TestExplore -v -args -sim.seed=1610 -sim.commands   # with Redis's commands
//
// make explore runs an exploration of SEEDS seeds (docs/simulator.md has the last figures).
//
// # What a run may vary, and what a process cannot model
//
// A seed fixes the workload, the upstream's plans, the faults, their virtual times and each
// instance's jitter. Goroutines that run at one virtual instant run in any order (select,
// map order, the scheduler), so two runs of a seed can interleave differently there; a
// story's times are off the grid of the package's own timers, and it is run twice to show
// it tells one story. go-redis picks a Cluster node at random for its pub/sub connection.
//
// In one process a fault is what the network and the stand-in do: a paused instance's
// connections, clients and upstream calls are held, but its own timers still run (a real
// SIGSTOP stops them too); a killed instance stops talking, and its goroutines, which no
// longer reach anything, end when the run ends. A connection's handshake, and the layout
// and command table a Cluster client asks for, flow even through a fault (see net_test.go:
// go-redis holds a mutex across them, and a goroutine waiting for a mutex stops the bubble's
// clock), so a Redis that hangs hangs from its first command. The e2e suite keeps real
// processes, real SIGSTOP and real Redis restarts; the simulator adds the schedules they
// cannot explore.
package sim
