// Package e2e proves the proxy the way an operator meets it: separate processes, a real
// redis-server, a fake OpenAI upstream, real faults (kill -9, SIGSTOP, SIGTERM, Redis
// restarts), the official OpenAI SDKs as clients and a real Prometheus server.
//
// It has only tests; README.md lists the scenarios, one line each. `go test ./e2e/...`
// builds the proxy and the fake upstream (e2e/fakeupstream) once, then starts every process
// on free loopback ports and kills them when the test ends. The suite needs redis-server,
// prometheus and promtool, node and npm on PATH (scripts/ensure-deps.sh installs them) and
// the npm registry for the Node SDK; it never skips for a missing tool, it fails and says
// what to install.
package e2e
