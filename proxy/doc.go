// Package proxy is the HTTP side of llm-dedupe-proxy: it passes OpenAI-compatible requests to
// the upstream model API and streams the answers back, making one upstream call for
// identical requests in flight at once, on this instance or any other.
//
// What follows is a request's life, step by step, with the file that holds each step.
//
// # Arrival and guards
//
// [Proxy.ServeHTTP] first guards the request (guard.go): CONNECT, TRACE and TRACK, the
// HTTP/2 preface, a target that is not a path and a path with dot segments are refused
// before any routing, in the OpenAI error shape (errors.go). The guard gives the request
// its state, one context value for the whole request, and bounds the wait between two
// reads of its body (body_read_timeout).
//
// # Routing
//
// A POST to one of [Config.Paths] goes to the dedupe handler; every other request is
// passed through (proxy.go). Both go through the log middleware (log.go), which wraps the
// client's writer (statuswriter.go).
//
// # The key
//
// The dedupe handler (dedupe.go) passes a request that asks to bypass ([HeaderBypass]), or
// whose body is encoded, straight through. It reads any other's body, up to
// [Config.MaxBodyBytes], and makes its key (key.go) with the hashing package: the tenant's
// scope, the method, the path with its query sorted, the canonical body, and the namespace
// ([HeaderNamespace]) with its generation. Requests with equal keys share one upstream
// call and its answer.
//
// # Policy
//
// The request's Cache-Control (no-cache, no-store, max-age), the [StoreRule]s and the
// upstream's status decide what may be served from storage, shared, stored or retried
// (policy.go). Answers that ask the client to call a tool may be shared and not stored. A
// request that samples (sampled.go: temperature absent or above 0, no seed) shares a call in
// flight but is served no stored answer, but a client's retry ([HeaderRetryCount]); or, as
// [Config.Sampled] says, is handled like any other, or goes straight upstream.
//
// # The flight
//
// The request joins the flight of its key in [Flights], or starts it (dedupe.go). A unary
// request that starts a flight makes the call on its own goroutine. An answer larger than
// [Config.MaxResponseBytes] is not shared: it goes to the client whose request made the
// call, through a handoff (handoff.go), and the others get an error. The handler waits on
// its flight with a context that a handoff can also end (waitctx.go).
//
// # The upstream call
//
// The owner of a flight calls the upstream through [Config.Transport] (upstream.go,
// transport.go) with its client's headers but the hop-by-hop ones, the proxy's own and
// Accept-Encoding: the transport asks for gzip and hands on plain bytes. It replays to
// followers and hits only the headers that describe the answer. A read that waits longer
// than [Config.IdleTimeout] ends the call.
//
// # Streams
//
// A streamed answer (server-sent events) is relayed to the flight as it arrives (sse.go);
// only a stream that ended as its API ends a whole answer is stored. A client whose stream
// loses its owner mid-answer gets an error event and a clean end, never a mix of two
// answers.
//
// # The answer
//
// Each waiting request writes its flight's answer as it arrives (dedupe.go), with its role
// ([HeaderRole]: owner, follower or hit) and key ([HeaderKey]). A failure before any byte
// is an OpenAI-style error (errors.go); one after is a broken connection. Each write to
// the client must make progress within [Config.SendTimeout] (statuswriter.go). Followers
// and hits count the tokens they saved from the answer's usage (usage.go).
//
// # Passthrough
//
// Everything not deduplicated goes to the upstream through a reverse proxy
// ([NewPassthrough], passthrough.go), its body streamed both ways, within
// [Config.Timeout]; an upgrade (a WebSocket) is passed and outlives that timeout once the
// upstream has answered 101.
//
// # Admin
//
// [NewAdmin] serves the operators' API on a listener of its own (admin.go): the flights in
// progress, and purges of one stored answer or of a whole namespace.
//
// # Logs and metrics
//
// Every request gets one log line and one count once its handler returns or panics
// (log.go): route, role, status, duration and the start of its key, never a credential or
// a body; a client that left is counted 499 and its connection closed. Measurements go to
// the [Recorder]. Secrets in URLs are redacted from logs (redact.go).
//
// # Shutdown
//
// [Proxy.Drain] makes /readyz answer 503 and closes each client connection after its next
// answer, so that a load balancer sends new requests elsewhere (shutdown.go). When the
// Flights are closed, a call still running is released to another instance and its own
// client gets 503 shutting_down; [Proxy.CloseIdleConnections] then closes the upstream
// connections kept for the next call.
package proxy
