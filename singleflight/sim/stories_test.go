package sim

import "time"

// stories are the scenarios TestStories keeps as golden timelines. Their times are odd
// milliseconds, off the grid of the package's own timers (heartbeats, lease ends, the
// 250 ms polls): two events at one virtual instant run in either order, and a story must
// tell one.
func stories() []story {
	every := func(p plan) func(string, int) plan { return func(string, int) plan { return p } }
	stream := map[string]keySpec{"k1": {stream: true}}
	unary := map[string]keySpec{"k1": {}}
	return []story{
		{
			name: "owner-killed-follower-has-bytes",
			about: `Instance A owns a streamed flight and is killed mid-stream; B's client already has bytes.
What does B's client get, and when? It keeps what it has, then an error, never bytes of
another call. B looks a lease after the last batch it read (its clock's own timer: a
follow this young does not count A's alive messages), finds the lease A renewed just
before it died still running, looks again at its end, and makes no call: nobody there
could use one (ADR 0026).`,
			cfg: config{seed: 1, instances: 2, keys: stream, plans: every(plan{chunks: 8, gap: 450 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.kill(1213*time.Millisecond, "A")
			},
			settle: 10 * time.Second,
		},
		{
			name: "owner-killed-follower-has-none",
			about: `Instance A owns a streamed flight whose first bytes are slow, and is killed before they
come; B's client has nothing yet. B looks a lease after A's last renewal, finds the lease
run out, waits the jitter, claims attempt 2 and calls; its client reads that call whole.`,
			cfg: config{seed: 1, instances: 2, keys: stream, plans: every(plan{chunks: 3, gap: 1900 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.kill(1307*time.Millisecond, "A")
			},
			settle: 10 * time.Second,
		},
		{
			name: "follower-takes-over-a-failed-attempt",
			about: `The upstream answers A's call 500. A's client gets its own 500 at once (ADR 0025); the
failed entry wakes B's follower, which waits the jitter and claims attempt 2 (ADR 0003).
A's other client, which waits too, follows B's call.`,
			cfg: config{seed: 2, instances: 2, keys: unary, plans: func(_ string, n int) plan {
				if n == 1 {
					return plan{chunks: 1, gap: 300 * time.Millisecond, fail: "500"}
				}
				return plan{chunks: 2, gap: 700 * time.Millisecond}
			}},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 51 * time.Millisecond, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
			},
			settle: 5 * time.Second,
		},
		{
			name: "follower-calls-when-its-instance-loses-redis",
			about: `B follows A's call and is cut off from Redis. Its look cannot be answered; its client
has no bytes, so once the lease B knew of has run out B calls the upstream itself,
local-only (ADRs 0022, 0023). A's call goes on for A's client: two calls, a fault's cost.`,
			cfg: config{seed: 3, instances: 2, keys: stream, plans: every(plan{chunks: 2, gap: 2900 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.partition(709*time.Millisecond, 20017*time.Millisecond, "B")
			},
			settle: 5 * time.Second,
		},
		{
			name: "redis-hangs-under-an-owner",
			about: `Redis stops answering (connections open) while A owns a streamed call that B follows
with bytes. A's append times out, a PING confirms the hang, A degrades and its client gets
every byte from A's memory; B's followers with bytes wait for Redis (ADR 0060). When Redis
answers again, A's kept batches and its final write land (the token decides), and B's
client reads the rest of the same call.`,
			cfg: config{seed: 4, instances: 2, keys: stream, plans: every(plan{chunks: 6, gap: 770 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.hangRedis(1109*time.Millisecond, 4037*time.Millisecond, 0)
			},
			settle: 5 * time.Second,
		},
		{
			name: "cluster-master-hangs-under-an-owner",
			about: `In a Cluster of three masters, the master that holds k1 hangs while A owns k1's call
and B follows it; k2 lives on another master. Only k1's shard degrades: k2's flight, asked
meanwhile, is shared through Redis as ever (ADR 0063).`,
			cfg: config{seed: 5, instances: 2, masters: 3, keys: map[string]keySpec{"k1": {stream: true}, "k2": {}},
				plans: every(plan{chunks: 4, gap: 810 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.hangRedis(1109*time.Millisecond, 5041*time.Millisecond, w.nodeIndex("k1"))
				w.ask(clientSpec{at: 2311 * time.Millisecond, on: "A", key: "k2"})
				w.ask(clientSpec{at: 2419 * time.Millisecond, on: "B", key: "k2"})
			},
			settle: 5 * time.Second,
		},
		{
			name: "stale-owner-paused-past-its-lease-is-fenced",
			about: `A owns a call and is paused past its lease; B takes the flight over with a new token.
When A resumes, its renewal compares the whole token and is refused: A cancels its call
(lease lost); its client, which has bytes of A's call, gets an error (a client with none
would follow B's attempt; ADRs 0002, 0027). A's timers ran while it was paused: in one
process a pause holds A's connections, not its clock (sim/doc.go).`,
			cfg: config{seed: 6, instances: 2, keys: stream, plans: every(plan{chunks: 3, gap: 1700 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.pause(311*time.Millisecond, 6029*time.Millisecond, "A")
			},
			settle: 5 * time.Second,
		},
		{
			name: "where-an-answer-is-stored",
			about: `A's call completes: complete.lua writes the done entry and, the answer being storable, the
result for result_ttl; A keeps it in memory too (ADR 0028). A later client on B is
answered by its lookup (a hit from Redis, which B then keeps); one on A from A's memory,
without asking Redis.`,
			cfg: config{seed: 7, instances: 2, keys: unary, plans: every(plan{chunks: 2, gap: 330 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 2003 * time.Millisecond, on: "B", key: "k1"})
				w.ask(clientSpec{at: 3007 * time.Millisecond, on: "A", key: "k1"})
				w.ask(clientSpec{at: 4013 * time.Millisecond, on: "B", key: "k1"})
			},
			settle: time.Second,
		},
		{
			name: "abandoned-call-cut-once-the-follower-elsewhere-leaves",
			about: `A's client leaves early; B's follower still waits, its mark in the meta, so A's renewals
do not cut the call. When B's client leaves too, B takes its mark off (unwait.lua); A's
next renewal after a grace cuts the flight in Redis and A cancels the call (ADR 0074).`,
			cfg: config{seed: 8, instances: 2, keys: stream, plans: every(plan{chunks: 20, gap: 430 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1", leave: 607 * time.Millisecond})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1", leave: 3709 * time.Millisecond})
			},
			settle: 5 * time.Second,
		},
		{
			name: "graceful-shutdown-hands-a-flight-over",
			about: `A owns a slow call and shuts down with a grace shorter than the call. Once the grace
ends, A releases the flight (failed, shutdown: no attempt used up) and its client gets
the shutdown error; B's follower, woken by the failed entry, takes the flight over.`,
			cfg: config{seed: 9, instances: 2, keys: stream, plans: every(plan{chunks: 2, gap: 2300 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.shutdown(607*time.Millisecond, 917*time.Millisecond, "A")
			},
			settle: 5 * time.Second,
		},
		{
			name: "follower-with-bytes-missing-entries-makes-no-call",
			about: `B's client has the first chunk of A's streamed call when a pub/sub message is lost
and Redis restarts from a snapshot that does not hold the second chunk either. B reads on,
finds a gap, and at the done entry looks the flight up: the answer was not stored, and its
only caller has bytes no new call could continue, so B makes none (ADR 0026): its client
gets an error, never a second call's bytes.`,
			cfg: config{seed: 11, instances: 2, keys: stream, opts: optsResultTTL(-1),
				plans: every(plan{chunks: 5, gap: 403 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.losePublish(701*time.Millisecond, 3, 0)
				w.restartRedis(1009*time.Millisecond, 97*time.Millisecond, 511*time.Millisecond, 0)
			},
			settle: 5 * time.Second,
		},
		{
			name: "stale-owners-whole-answer-is-no-hit",
			about: `A is paused while its call runs; B takes the flight over and stores its call's answer.
A resumes, its call returns whole, and A's clients get it (ADR 0027), but its final write
is refused: the flight's answer is B's, and A drops its own from memory, so that from
then on every instance's next caller gets B's answer as a hit. (Between A's answer and
the refusal, A's memory holds A's own answer: the checker allows a hit of it only then.)`,
			cfg: config{seed: 12, instances: 2, keys: unary, plans: every(plan{chunks: 1, gap: 1013 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.pause(509*time.Millisecond, 6007*time.Millisecond, "A")
				w.ask(clientSpec{at: 9011 * time.Millisecond, on: "A", key: "k1"})
				w.ask(clientSpec{at: 9013 * time.Millisecond, on: "B", key: "k1"})
			},
			settle: time.Second,
		},
		{
			name: "shutdown-takes-its-marks-off",
			about: `A's client leaves; B's follower keeps A's call running with its mark. B shuts down:
its lead ends and takes its mark off before B is closed, so A's next renewal cuts the
call a grace later instead of running it to its end for nobody (ADR 0074).`,
			cfg: config{seed: 13, instances: 2, keys: stream, plans: every(plan{chunks: 30, gap: 397 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1", leave: 509 * time.Millisecond})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1"})
				w.shutdown(1711*time.Millisecond, 313*time.Millisecond, "B")
			},
			settle: 5 * time.Second,
		},
		{
			name: "mark-left-in-an-outage-comes-off",
			about: `B follows A's call; B is cut off from Redis, finds it so, and its client leaves: B
cannot take its mark off then, and keeps it to send. Once B reaches Redis again it sends
it, and A cuts the call a grace later, instead of running it to its end for nobody.`,
			cfg: config{seed: 14, instances: 2, keys: stream, plans: every(plan{chunks: 40, gap: 397 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1", leave: 509 * time.Millisecond})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k1", leave: 3307 * time.Millisecond})
				w.partition(1013*time.Millisecond, 4019*time.Millisecond, "B")
			},
			settle: 5 * time.Second,
		},
		{
			name: "restart-from-an-older-snapshot-keeps-the-call",
			about: `Redis restarts from a snapshot taken before B's follower marked A's flight, while A's
own client has left: the mark is lost, and A's renewal would cut the call under B. The
renewal finds the lease and the batches shorter than A knows it wrote: Redis went back in
time, no mark can be trusted, and the call finishes (renew.lua); B's client gets it whole.`,
			cfg: config{seed: 15, instances: 2, keys: stream, plans: every(plan{chunks: 12, gap: 397 * time.Millisecond})},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1", leave: 1013 * time.Millisecond})
				w.ask(clientSpec{at: 503 * time.Millisecond, on: "B", key: "k1"})
				w.restartRedis(3511*time.Millisecond, 97*time.Millisecond, 307*time.Millisecond, 0)
			},
			settle: 5 * time.Second,
		},
		{
			name: "a-lost-done-costs-no-more-than-the-wait-so-far",
			about: `A owns two calls: k1 runs long, k2 is streamed to A's client and B's. The pub/sub
message that k2 is done is lost on its way to B. A's instance goes on saying it is alive,
for k1; B believes it only for as long as B has waited (one lease at least, ten at most),
then looks k2 up and serves the stored answer (ADR 0082). No wait on a live instance lasts
for ever on one lost message.`,
			cfg: config{seed: 16, instances: 2, keys: map[string]keySpec{"k1": {stream: true}, "k2": {stream: true}},
				plans: func(key string, _ int) plan {
					if key == "k1" {
						return plan{chunks: 1, gap: 30011 * time.Millisecond}
					}
					return plan{chunks: 6, gap: 449 * time.Millisecond}
				}},
			drive: func(w *world) {
				w.ask(clientSpec{at: 0, on: "A", key: "k1"})
				w.ask(clientSpec{at: 51 * time.Millisecond, on: "A", key: "k2"})
				w.ask(clientSpec{at: 103 * time.Millisecond, on: "B", key: "k2"})
				w.losePublish(2503*time.Millisecond, 2, 0)
			},
			settle: time.Second,
		},
	}
}
