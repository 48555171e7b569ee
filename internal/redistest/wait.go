package redistest

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// WaitUntil polls cond until it holds, for states that no event announces (a gauge, a
// readiness answer, a cluster's state). It fails the test with cond's last description
// after d.
func WaitUntil(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := Until(d, what, cond); err != nil {
		t.Fatal(err)
	}
}

// Until is WaitUntil for a goroutine other than the test's, which must not end the test:
// it returns the failure for the test's goroutine to report.
func Until(d time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(d)
	for {
		ok, last := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not reached within %v; last: %s", what, d, last)
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
