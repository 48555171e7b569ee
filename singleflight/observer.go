package singleflight

import "time"

// Observer receives what happens inside a Group, for metrics and logs. Observe is called
// synchronously from the Group's goroutines and must not block.
type Observer interface {
	Observe(Event)
}

// EventKind names an Event.
type EventKind uint8

// Event kinds.
const (
	EventRole            EventKind = iota + 1 // a local flight's role was decided (Role)
	EventTakeover                             // this process contends for a flight (Reason: expired, failed, shutdown, degraded)
	EventLeaseLost                            // an owner learnt another took over; its call was cancelled
	EventFencedWrite                          // a stale owner's write was refused (Op)
	EventHeartbeatFailed                      // a renewal failed for other reasons than fencing (Err)
	EventRedisError                           // a Redis command failed (Op, Err)
	EventDegraded                             // a Redis shard stopped answering: its flights go local-only (Op: the first shard, Err: the cause)
	EventRecovered                            // every Redis shard answers again: distributed dedupe everywhere
	EventFlightStart                          // a local flight started
	EventFlightEnd                            // a local flight ended
	EventWait                                 // a follower's wait for a remote owner ended (Duration; Reason: how, follow.go followKind)
	EventShardDown                            // one Redis shard cannot be used (Op: its master's address; "" = all of Redis)
	EventShardUp                              // that shard answers again (Op)
	EventPurge                                // this Group purged stored answers (Op: answer or namespace)
	EventInvalidated                          // a purge reached this Group's memory (Op: answer, namespace, or all after a lost subscription)
	EventSubscribed                           // the purge subscription is (again) listening
	EventAbandoned                            // no caller waited for an attempt owned here, and the spell ended (Reason: cancelled, finished, rejoined; Bytes: received for nobody)
	EventLook                                 // a follower looks its flight up in Redis (Reason: why now, clock.go lookReason)
)

// Event is one thing that happened. Only the fields its kind names are set.
type Event struct {
	Kind     EventKind
	Key      string
	Role     Role
	Reason   string
	Op       string
	Err      error
	Duration time.Duration
	Bytes    int64
}

type nopObserver struct{}

func (nopObserver) Observe(Event) {}
