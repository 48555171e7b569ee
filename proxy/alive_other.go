//go:build !unix

package proxy

import "net"

// checkable: here a socket cannot be looked at without reading it, so no connection is
// kept for another call.
func checkable(net.Conn) bool { return false }

func alive(net.Conn) bool { return false }
