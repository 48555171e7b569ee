//go:build !unix

package proxy

import "net"

// alive cannot look at a socket here without reading it: a connection the upstream closed
// fails the call that takes it.
func alive(net.Conn) bool { return true }
