//go:build !unix

package proxy

import "net"

// canCheck: here a socket cannot be looked at without reading it, so a kept connection
// could not be told from one the upstream closed: every call goes through net/http.
const canCheck = false

func checkable(net.Conn) bool { return false }

func alive(net.Conn) bool { return false }
