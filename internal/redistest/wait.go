package redistest

import (
	"net"
	"testing"
	"time"
)

// WaitUntil polls cond until it holds, for states that no event announces (a gauge, a
// readiness answer, a cluster's state). It fails the test with cond's last description
// after d.
func WaitUntil(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v; last: %s", what, d, last)
		}
		time.Sleep(10 * time.Millisecond) // polling: there is no event to wait on
	}
}

// FreeAddr is a loopback address whose port was free when it was asked for.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}
