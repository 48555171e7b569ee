//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// canCheck: alive can look at a socket here.
const canCheck = true

// rawConn is the socket under c: a dialer may wrap the connection it makes.
func rawConn(c net.Conn) (syscall.RawConn, bool) {
	for {
		if sc, ok := c.(syscall.Conn); ok {
			rc, err := sc.SyscallConn()
			return rc, err == nil
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil, false
		}
		c = w.NetConn()
	}
}

// checkable is whether alive can look at c's socket.
func checkable(c net.Conn) bool {
	_, ok := rawConn(c)
	return ok
}

// alive is whether an idle connection is still open: a read that would block says so; end
// of file, bytes nobody asked for or an error say it is not. It reads the socket without
// waiting, as go-redis checks its pooled connections.
func alive(c net.Conn) bool {
	rc, ok := rawConn(c)
	if !ok {
		return false
	}
	open := false
	err := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, rerr := syscall.Read(int(fd), b[:])
		open = errors.Is(rerr, syscall.EAGAIN)
		return true
	})
	return err == nil && open
}
