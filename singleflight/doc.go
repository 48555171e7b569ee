// Package singleflight coordinates identical calls so that exactly one of them, in this
// process or on any instance sharing a Redis, runs the upstream call, and every other
// caller reads its outcome, streamed live.
//
// It knows nothing about HTTP: a key, an owner function that writes a head and chunks,
// and readers that get the same bytes.
//
// # Roles
//
// Group.Do joins the local flight of a key or starts one. Only the flight's leader talks to
// the coordinator, so a process holds at most one Redis conversation per key however many
// callers wait. A leader following another instance's owner holds no goroutine while it
// waits (park.go): its state, hooked to what can wake it. Its answer is one of:
//
//   - hit: a stored result (Options.ResultTTL) serves every local caller;
//   - follow: another instance owns the call; the leader reads its stream into the local log;
//   - claim: this process becomes the owner and runs the leader's function.
//
// After an attempt is abandoned (failed, expired, lost), a flight goes on only while one of
// its local callers has received nothing yet: a caller with bytes of the abandoned attempt
// can only end with an error, and no upstream call is made that nobody could use.
//
// Every local caller has a Reader over the flight's broadcast log: an append-only list of
// chunks with a notify channel, read from the caller's own position. A caller that leaves
// does not disturb the others. The first caller's Reader reports RoleOwner when its process
// ran the call; the others report RoleFollower; all report RoleHit for a stored result.
//
// # Redis keys
//
// With the prefix P (default "ai:flight") and the key K:
//
//	P:meta:{K}    hash    state R|D|F, token, owner, lease_until, attempt, created, gen, n, route, model
//	P:stream:{K}  stream  gen, chunk, done, failed entries, each with the writer's token
//	                      (done also has landed: when it was written, µs; see answered.go)
//	P:result:{K}  hash    status, header, body, at, token, landed   (only for a stored outcome)
//	P:owner-seq   string  INCR counter, first part of every fencing token
//	P:ns:NAME     string  generation of namespace NAME (see purge.go)
//	P:invalidate  channel purges, for every instance's memory (see purge.go)
//	P:stream:{K}  channel each entry added to the stream of the same name (see wake.go)
//	P:alive:ID    channel instance ID began a round of renewals (see renewer.go)
//
// The {K} hash tag puts a flight's three keys in one Cluster slot, so one script touches them
// atomically. owner-seq lives in another slot: an instance reserves its numbers in blocks
// (INCRBY 64), and the lookup of a new flight carries a candidate token, so that a key
// nobody holds is claimed in the lookup itself. An owner costs two round trips, lookup
// and complete; a takeover is lookup, jitter, lookup, then claim.lua's compare-and-set.
//
// # States
//
//	          claim (absent, D without stored result, F, or R with lease run out)
//	(none) ───────────────────────────────► R ──complete──► D ──linger──► (expired)
//	                                        │ ▲
//	                                  fail  │ │ claim by a contender after jitter
//	                                        ▼ │ (attempt+1 ≤ MaxAttempts)
//	                                        F
//
// # Rules, and where they live
//
//   - One clock: every lease decision is made in a script with Redis's TIME; lease_until is
//     Redis time, and scripts answer the remaining milliseconds. TTLs are PEXPIRE with
//     durations, never a proxy's timestamp. Go code measures with the monotonic clock.
//     One bound departs from it, and decides no lease: a follower's fence adds a monotonic
//     wait to a Redis time a lookup answered, with 0.1 % for drift (answered.go). (Scripts need effect replication for TIME followed by writes; it is the default
//     since Redis 5, and the minimum server is 6.2.)
//   - Lease, not lock: the owner renews lease_until every HeartbeatInterval (renew.lua).
//     The meta lives LeaseTTL+Linger, so attempt survives an owner's death.
//   - Fencing: a token is "seq-instance-local": a number of the owner-seq counter, the
//     instance id and a per-process counter, because after a failover INCR can repeat a
//     number. claim.lua is a compare-and-set on the token and the state the claimer saw
//     (complete keeps the token, so a token alone cannot tell a flight that completed
//     since); renew, append, complete and fail compare the whole token and do nothing for
//     anyone else.
//   - Restore: Redis can lose a running flight (a restart without persistence, a failover
//     to a replica that had not received the claim). Every owner's write carries the
//     lease_until Redis last gave it, and restore.lua, prepended to renew, append,
//     complete and fail, puts an absent meta back while that lease runs by Redis's clock:
//     within it nobody else can have owned and finished the flight, so no stale owner
//     writes. A follower that finds its flight absent waits for this until the lease it
//     knew of runs out.
//   - Owner suicide: a refused renewal or append cancels the flight context with cause
//     ErrLeaseLost; the local readers then follow the new owner. A complete refused at the
//     end still serves the local readers (they hold a whole response), but the stored
//     result is the new owner's.
//   - No zombie owner: the heartbeat belongs to the attempt and stops with the owner
//     function, which runs under Options.Timeout.
//   - Safe twice: go-redis retries on broken connections, so a repeated claim with my own
//     token answers owner, appends carry a batch number n and are skipped when already in,
//     complete and fail are no-ops when already done by the same token.
//   - No lost wake-up: lookup answers the stream ID of the generation's first entry, and
//     the follower reads after that concrete ID (never "$"): when it subscribes its
//     flight's channel, again when Redis confirms the subscription (and after every
//     reconnect), then takes the entries pushed. When nothing came for a lease and its
//     owner did not say it is alive, or a read fails, the meta is checked again.
//   - The stream before the meta: when that check no longer says "running, same owner",
//     the follower reads what follows its position before acting on it. A finished
//     attempt wrote its end before any later generation's first entry, so a follower of
//     an answer that completed always reads it to its end, whatever started since.
//   - Same answer, no reset: a stored result carries the token that wrote it; a follower
//     of that attempt finishes from it, appending only what its readers do not have yet.
//   - No thundering herd: local coalescing makes one contender per process, and a contender
//     waits a random part of TakeoverJitter, then looks again: the first to wake claims,
//     the rest find a running owner and follow.
//   - Waiting costs no command: followers are pushed stream entries over one pub/sub
//     connection per process (wake.go), and every owned lease is renewed in one batch per
//     HeartbeatInterval, followed by the owner's alive message (renewer.go); a lease whose
//     final write is being made is renewed later, when an interval of it is left.
//   - Everything expires: meta and stream LeaseTTL+Linger while running and Linger once
//     done; the result ResultTTL; owner-seq a week (tokens stay unique without it). A
//     claim trims stream entries older than Linger (IDs are the server's milliseconds),
//     never the generation that just ended: its followers may be between two reads.
//   - Not after the answer: complete stamps the done entry and the stored answer with its
//     own Redis time (the owner goes by its own clock); a caller that may have joined a local flight after that
//     (by an upper bound from the flight's lookups) does not take the answer and joins
//     the key anew, so a request sent after a unary answer arrived never gets that answer
//     as if in flight (answered.go).
//   - Owner code never hangs a follower: a panic is recovered and fails the attempt.
//
// # Outcomes
//
// The owner function's Result says what may be done with its response: Store (shared and
// stored), Share (shared with this flight only), Retry (the attempt failed: a waiter takes
// over after the jitter, up to MaxAttempts, then every waiter gets the last failed
// response). The caller whose function failed gets its own failed response at once; it is
// what its upstream call said, and nothing is retried for a caller no one else waits with.
//
// # Streaming
//
// What the owner writes reaches local readers at once and the stream in batches of at most
// BatchDelay or BatchBytes. A new generation (takeover) resets the log: a reader that has
// already delivered bytes of the old one gets ErrGenerationChanged; one that has not moves
// on seamlessly. A generation is capped at StreamMaxLen entries (the rest comes with the
// final write); a follower that finds a gap in the batch numbers delivers no hole: it waits
// for the end and finishes from the stored answer of the same token, or gives the
// generation up.
//
// # When Redis fails
//
// A Redis error that says the server cannot be used degrades the shard that holds the
// flight's key (in a Cluster, the master of its slot; otherwise all of Redis): new flights
// of that shard run local-only (one call per process), its waiting followers take over
// locally, and a probe checks every 250 ms until it answers or its slots moved to a
// promoted replica; then distributed mode resumes by itself. Flights on healthy shards are
// not touched. owner-seq is not needed to dedupe: without it tokens keep the last number
// reserved. Observer reports EventShardDown and EventShardUp per shard, EventDegraded and
// EventRecovered when the first goes down and the last comes back.
package singleflight
