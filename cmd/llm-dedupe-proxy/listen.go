package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// listenOn opens the listener of a listen key (listen, admin.listen). An address that cannot
// be listened on is the configuration's to change, like an invalid value: the error is a
// configError naming the key (and env, the variable that set it, if one did), and for a port
// already taken, what may hold it and the flag that moves it. See ADR 0079.
func listenOn(key, addr, env string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	ce := &configError{Key: key, Env: env}
	var op *net.OpError
	if errors.As(err, &op) {
		err = op.Err // "bind: address already in use", without "listen tcp ADDR:"
	}
	host, _, _ := net.SplitHostPort(addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		who := "another llm-dedupe-proxy still running, or another server"
		if key == "admin.listen" {
			who = "another instance's admin API"
		}
		ce.Rule = fmt.Sprintf("%s is taken (by %s?): stop what holds it, or listen elsewhere with --%s=%s",
			addr, who, key, net.JoinHostPort(host, "PORT"))
	} else {
		ce.Rule = fmt.Sprintf("cannot listen on %s: %v", addr, err)
	}
	return nil, ce
}
