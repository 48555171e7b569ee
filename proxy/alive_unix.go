//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// alive is whether an idle connection is still open: a read that would block says so; end
// of file, bytes nobody asked for or an error say it is not. It reads the socket without
// waiting, as go-redis checks its pooled connections.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, rerr := syscall.Read(int(fd), b[:])
		open = errors.Is(rerr, syscall.EAGAIN)
		return true
	})
	return err == nil && open
}
