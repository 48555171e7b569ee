package main

import (
	"testing"
)

func TestBuckets(t *testing.T) {
	lines := []string{
		"     0.01s  0.24%  0.24%      1.96s 47.69%  net/http.(*conn).serve",
		"         0     0%  0.24%      0.92s 22.38%  github.com/redis/go-redis/v9.(*Script).Run",
		"     0.01s  0.24%  0.73%      0.30s  7.30%  github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy.(*Proxy).ownerFunc.func1",
		"     0.01s  0.24%  0.73%      0.20s  4.87%  net/http.(*persistConn).readLoop",
		"     0.72s 17.52% 19.22%      0.72s 17.52%  internal/runtime/syscall/linux.Syscall6",
		"         0     0%  1.70%      0.10s  2.43%  github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight.decodeHead (inline)",
	}
	got := buckets(lines)
	want := map[string]float64{
		"HTTP server: read request, handler, write answer (net/http.(*conn).serve)":  47.69,
		"Redis round trips, every script (go-redis (*Script).Run, (*Pipeline).Exec)": 22.38,
		"upstream call (proxy ownerFunc; net/http's connection loops, where used)":   7.30 + 4.87,
		"system calls, flat (Syscall6)":                                              17.52,
		"… decoding a hit's stored header (singleflight.decodeHead)":                 2.43,
	}
	for k, v := range want {
		if d := got[k] - v; d > 1e-9 || d < -1e-9 {
			t.Errorf("bucket %q = %v; want %v", k, got[k], v)
		}
	}
	if got["request key (hashing.(*Hasher).KeyIn)"] != 0 {
		t.Errorf("a bucket without a matching line = %v; want 0", got["request key (hashing.(*Hasher).KeyIn)"])
	}
}

func TestSentByClient(t *testing.T) {
	for cmd, want := range map[string]bool{
		"evalsha": true, "eval": true, "xread": true, "ping": true, "hello": true, "client|setinfo": true,
		"hget": false, "xadd": false, "pexpire": false, "incr": false, "time": false,
	} {
		if got := sentByClient(cmd); got != want {
			t.Errorf("sentByClient(%q) = %v; want %v", cmd, got, want)
		}
	}
}

func TestBreakdown(t *testing.T) {
	got := breakdown(map[string]float64{"xread": 1, "evalsha": 4, "hello": 0.001})
	if want := "EVALSHA 4.00, XREAD 1.00"; got != want {
		t.Errorf("breakdown = %q; want %q", got, want)
	}
}
