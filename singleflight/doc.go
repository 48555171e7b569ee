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
// callers wait. Its answer is one of:
//
//   - hit: a stored result (Options.ResultTTL) serves every local caller;
//   - follow: another instance owns the call; the leader reads its stream into the local
//     log, parked while nothing comes (ADR 0015);
//   - claim: this process becomes the owner and runs the starter's function.
//
// Every local caller has a Reader over the flight's broadcast log, read from its own
// position; a caller that leaves does not disturb the others. The starter's Reader (the
// first caller's) reports RoleOwner when its process ran the call, the others
// RoleFollower; all report RoleHit for a stored result.
//
// # Redis keys
//
// With the prefix P (default "ai:flight") and the key K:
//
//	P:meta:{K}    hash    state R|D|F|A, token, owner, lease_until, attempt, created, gen, n, route, model;
//	                      w:ID:F (local flight F of instance ID follows), left, finish, oc (ADR 0074)
//	P:stream:{K}  stream  gen, chunk, done, failed entries, each with the writer's token
//	                      (done also has landed: when it was written, µs; see answered.go)
//	P:result:{K}  hash    status, header, body, at, token, landed   (only for a stored outcome)
//	P:owner-seq   string  counter, first part of every fencing token (reserved in blocks)
//	P:ns:NAME     string  generation of namespace NAME (see purge.go)
//	P:invalidate  channel purges, for every instance's memory (see purge.go)
//	P:stream:{K}  channel each entry added to the stream of the same name (see internal/wake)
//	P:alive:ID    channel instance ID renewed its leases (see renewer.go, internal/wake/alive.go)
//
// The {K} hash tag puts a flight's three keys in one Cluster slot, so one script touches
// them atomically. An owner costs two round trips, lookup (which claims a free key) and
// complete (ADR 0002); a takeover is lookup, jitter, lookup, then claim.lua (ADR 0003).
//
// # States
//
//	          claim (absent, D without stored result, F, A, or R with lease run out)
//	(none) ───────────────────────────────► R ──complete──► D ──linger──► (expired)
//	                                        │ ▲ │
//	                                  fail  │ │ └──cut (nobody waits, ADR 0074)──► A
//	                                        ▼ │ claim by a contender after jitter
//	                                        F   (attempt+1 ≤ MaxAttempts)
//
// # Rules
//
//   - One clock: every lease decision is made in a script with Redis's TIME, TTLs are
//     PEXPIRE durations, and Go code measures with the monotonic clock. The landing gate alone adds
//     a monotonic wait to a Redis time, and decides no lease (ADR 0021). Scripts that write
//     after TIME need effect replication, the default since Redis 5.
//   - Lease, not lock: one renewer per process renews every lease in rounds, a pipeline per
//     shard (a hung master fails only its own), then publishes an alive message; a lease
//     whose final write is being made is renewed late (ADRs 0007, 0008, 0081). The
//     heartbeat lives under Options.Timeout: no zombie owner.
//   - Fencing: renew, append, complete and fail compare the whole token; claim.lua compares
//     the token and the state the claimer saw (ADRs 0002, 0003).
//   - Restore: an owner puts back a meta Redis lost only while its lease runs by Redis's
//     clock (ADR 0010); past it, it keeps its call for its local callers (ADR 0011).
//   - Outlast an outage: a follower whose callers have bytes waits for Redis rather than
//     go local, and an owner's final write goes on past its lease while its shard is
//     degraded; the token decides whether it lands (ADR 0060).
//   - Owner suicide: a refused renewal or append cancels the call with ErrLeaseLost; a
//     refused complete still serves the local readers (ADR 0027).
//   - Safe twice: a repeated lookup or claim answers owner, appends carry a batch number,
//     complete and fail are no-ops when already done by the same token (ADR 0004).
//   - No lost wake-up: a follower reads after a concrete stream ID (never "$") when it
//     subscribes and on every confirmation, then takes what is pushed (ADR 0012).
//   - The stream before the meta, and the same answer without a reset (ADR 0006).
//   - No thundering herd: one contender per process waits the jitter, looks again (ADR 0003).
//   - Everything expires; a claim trims only entries older than Linger (ADR 0005).
//   - Not after the answer: a caller that may have joined once it landed looks again
//     (ADR 0021).
//   - No call nobody can use; attempts are bounded by MaxAttempts (ADR 0026).
//   - No call nobody waits for: once no caller here has waited for AbandonGrace, the
//     owner's renewals ask Redis to cut the flight; renew.lua cuts it (state A) when no
//     follower's mark stands, none asked to finish and the last left a grace ago, and the
//     call is cancelled with ErrAbandoned. Followers mark the meta, and unmark it when they
//     leave; an instance killed leaves its marks, and the call runs to its end (ADRs 0074,
//     0080).
//   - Owner code never hangs a follower: a panic is recovered and fails the attempt.
//
// # Outcomes
//
// The owner function's Result says what may be done with its response: Store (shared and
// stored), Share (shared with this flight only), Retry (the attempt failed: a waiter takes
// over after the jitter, up to MaxAttempts, then every waiter gets the last failed
// response). The caller whose function failed gets its own failed response at once
// (ADR 0025).
//
// # Streaming
//
// What the owner writes reaches local readers at once, and the stream in batches: the first
// at once, each next BatchDelay after the one before or as soon as BatchBytes are pending,
// with all that is pending then (ADR 0017). A new generation resets the log:
// a reader that has delivered bytes of the old one gets ErrGenerationChanged; one that has
// not moves on. Past StreamMaxLen entries the rest comes with the final write, and a
// follower that finds a gap delivers no hole (ADRs 0004, 0005).
//
// # When Redis fails
//
// A Redis error that says the server cannot be used degrades the shard that holds the
// key (a Cluster master, or all of Redis): its new flights run local-only until a probe
// finds it usable (ADR 0022); its followers wait within their owner's lease (ADR 0023),
// or, when their callers have bytes, for Redis (ADR 0060).
// Observer reports EventShardDown and EventShardUp per shard, EventDegraded and
// EventRecovered for the first down and the last back.
//
// # Goroutines and ownership
//
// Every goroutine the package starts (a grep of "go ", ".Go(" and "AfterFunc(" finds no
// other), who starts it, and what it may touch (ADR 0076):
//
//   - The lead (run.go Group.lead): started by DoWith (group.go), or run on the caller's
//     goroutine if Inline. It runs leader.run (lead.go), the owner function (owner.go own,
//     callOwner) and the follow (follow.go); it owns its leader and follower, and the
//     flight under f.mu. On its end it sends unwait.lua (abandon.go unwait) when its lead
//     may have left a mark.
//   - The resume (park.go parking.resume): started by the first of a parked follow's
//     hooks to fire (a watch woken, its timer, the flight's context); it takes the lead
//     over (leader.resume) and may end the flight.
//   - The retry (lead.go retry; run.go retryAfterJitter, for memory and ownLocally): started
//     when an Inline flight's attempt failed, so that its caller gets its failure at once
//     (ADR 0025); it takes the lead over.
//   - The renewer (renewer.go loop): started by the first owned lease. Each round starts a
//     goroutine per shard (renew.go goRenew), each sending its renewals a chunk at a time
//     on renewChunks goroutines (send), and in a Cluster one for the alive message
//     (publishAlive); renewals that failed go on a late renewal (renewer.go renewLater),
//     which starts one per shard again (sendShards). They write remoteOwnership's atomics
//     (until and leaseFrom in renewed, cutIn in cutLearned), cancel an attempt whose lease
//     was lost (its cancel func) and carry out a cut (abandon.go cutAttempt). cutDue's
//     goroutine renews too, when it asks for a cut (remote_owner.go cut).
//   - The hub's sender and receiver (internal/wake conn.go): started by the first Watch or
//     Listen; the sender opens the connection, on a Cluster master wake.go hubNode picks.
//     The receiver runs purge.go's listener and wakes watches, which runs a park's hook
//     (it only starts a resume). An alive channel's silence timer (alive.go) wakes them too.
//   - The confirming PING (degrade.go confirmBy): started by a Redis operation's
//     half-deadline timer (remote.go watchedUntil), by an operation that timed out
//     (remote.go redisErrAt, newToken), and by the hub's PING left unanswered (wake.go
//     hubUnanswered). A PING not answered degrades the shard: the coalescer's calls for it
//     end (shed) and every watch is woken (WakeAll, which starts resumes). The probe
//     (degrade.go probe): started by the first shard to go down. Both touch remote's fields
//     under remote.mu alone.
//   - goOn (owner.go): started by a final write Redis did not answer; it makes it again
//     (ownership.again) after the caller was answered, then ends the attempt; it writes the
//     final write's fields (remote_owner.go try) from then on.
//   - A Writer's flush loop (writer.go flushLoop): started by a remote owner's first Write;
//     it shares the Writer's buffers under Writer.mu.
//   - The coalescer's senders (coalesce.go sendNext): the first pipeline of a shard goes on
//     the caller's goroutine, each next on a goroutine of its own, at most maxPipelines per
//     shard; they touch the queues under coalescer.mu.
//   - The resend of kept unwaits (unwait.go resend): started by the first unwait Redis did
//     not answer; it touches the queue under its mutex.
//   - The idle timer's cutDue (abandon.go): started when nobody waits for an attempt owned
//     here; after AbandonGrace it asks ownership.cut and cancels the attempt with
//     ErrAbandoned. An Inline starter's context end runs callerGone (group.go).
//
// Hand-over: a leader, and its follower, belong to one goroutine at a time, the one in
// leader.run. It lets go by parking (followHeld, then leadDetached) or by starting a
// retry (leadDetached), and from then on reads only the fields fixed when the leader was
// made (r, ctx, f). park sets every hook under parking.mu; the first to fire alone starts
// a resume (parking.fired), which takes parking.mu before it goes on.
// remoteOwnership's final-write fields (op, write, wctx, leaseEnd, raw, ferr) are written
// by own's goroutine until goOn starts, then by goOn's alone; its atomics (until, n,
// leaseFrom, finalPending, cutIn) are shared with the renewers and cutDue.
//
// # Walkthroughs
//
// walkthroughs.md follows three cases through the code, step by step, with the tests
// that hold each: an owner dies mid-stream; Redis hangs under an owner; a stale owner
// wakes. It also lists every way a follower calls the upstream itself, and where an
// answer is stored and how another instance finds it. When each step happens is told by
// the simulator's stories (sim/testdata/stories), checked against the code by its tests.
//
// # Glossary
//
//   - flight: one key's callers in one process, and its broadcast log (flight.go).
//   - leader: the one side of a flight that talks to the coordinator, its lead's state
//     machine (lead.go), run by the lead goroutine.
//   - starter: the caller whose call started a flight (Reader.starter); its Reader reports
//     RoleOwner when its process ran the call, and gets its own failed response (ADR 0025).
//   - owner: the instance whose attempt holds the flight's token and lease, and calls.
//   - follower: a caller served by another's call; in Redis, a leader reading another
//     instance's owner's stream.
//   - hit: an answer served from the store, in memory or in Redis.
//   - attempt: one upstream call of a flight, counted in the meta up to MaxAttempts.
//   - generation: one attempt in the stream (opened by a gen entry) and in the local log. A
//     namespace generation (purge.go) is another thing, and always named so.
//   - takeover: a claim of a flight whose attempt failed or whose lease ran out.
//   - lookup: lookup.lua, sent by a leader (which may claim) or by a follower's look.
//   - look: a follower's lookup of its flight's meta, when its clock says (clock.go next;
//     look.go follower.look, recheck).
//   - alive message: what an instance publishes after each round of renewals, naming the
//     tokens it stopped renewing (ADR 0009).
//   - trust: how long a follower believes its owner instance's alive messages after a look
//     found its attempt running: as long as it has followed, one to ten leases (ADR 0082).
//   - park: a waiting follower with no goroutine, hooked to what can wake it (ADR 0015).
//   - fence, fencing token: the token every owner write is compared against (ADR 0002).
//   - landing gate: answered.go's check that sends back a caller that may have joined after
//     an answer landed (ADR 0021).
//   - linger: how long a finished flight's stream stays readable (Options.Linger).
//   - restore: an owner putting back a meta Redis lost (restore.lua, ADR 0010).
//   - degrade: run a shard's flights local-only until the probe finds it usable.
//
// # Files
//
//   - group.go, join.go, flight.go: local flights and their readers; run.go: where every
//     flight starts (Group.lead) and ends; coordinator.go: the two backends, local.go
//     (memory) and remote.go (Redis).
//   - lead.go: the leader's state machine (ADR 0052); follow.go and look.go: the follower's
//     wait and its look-ups; clock.go: when it looks next, and why (ADR 0083); stream.go: the wire format of entries; hit.go: a stored answer.
//   - internal/wake (the connection, its watches, alive state; wake.go wires it): pub/sub wake-ups;
//     park.go: waiting without a goroutine.
//   - owner.go, remote_owner.go, writer.go, renewer.go, renew.go: owning an attempt.
//   - decision.go: typed replies of lua/*.lua; coalesce.go: lookups and completes sent
//     together, per shard (ADRs 0016, 0063).
//   - abandon.go: who still waits, and the cut of a call nobody waits for (ADR 0074).
//   - degrade.go, refusal.go, check.go: a failing Redis; answered.go: the landing gate;
//     purge.go: purges; cache.go (the Group's cache), lru.go (its LRU): answers kept in memory (ADR 0028).
package singleflight
