package main

import (
	"net"
	"os"
	"testing"
)

func TestTCPConnsTo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	if got := tcpConnsTo(os.Getpid(), l.Addr().String()); got != 0 {
		t.Errorf("before dialling: %d connections; want 0", got)
	}
	for range 3 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The accepted ends are this process's too, but their remote port is not the listener's.
	if got := tcpConnsTo(os.Getpid(), l.Addr().String()); got != 3 {
		t.Errorf("got %d connections; want 3", got)
	}
}
