package singleflight

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// unavailable tells errors of an unusable server from replies to one command (ADR 0022).
// TLS errors are no redis.Error: they fall through.
func unavailable(err error) bool {
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return false // this process is busy, Redis is not down: only that flight goes local
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return Refused(err) != NotRefused
	}
	return true
}

// timedOut reports whether err is a deadline that passed: a Redis that hangs.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// Refusal is how Redis refuses the proxy's configuration rather than one command: every
// command meets it until the configuration (or the server's role) changes.
type Refusal int

const (
	NotRefused        Refusal = iota
	RefusedAuth               // a wrong or missing password (NOAUTH, WRONGPASS)
	RefusedPermission         // an ACL user that may not run a command, or publish on a channel (Redis 7 gives new users none)
	RefusedDB                 // redis.db out of range: every connection's SELECT fails
	RefusedNotCluster         // several addresses naming a server that is no Cluster
	RefusedReadOnly           // a read-only replica
)

// Refused names err's refusal, or NotRefused.
func Refused(err error) Refusal {
	var re redis.Error
	if !errors.As(err, &re) {
		return NotRefused
	}
	msg := re.Error()
	switch {
	case strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "WRONGPASS"):
		return RefusedAuth
	case strings.HasPrefix(msg, "NOPERM"),
		strings.Contains(msg, "The user executing the script can't"), // a script's refusal, Redis 7.0
		strings.Contains(msg, "ACL failure in script"):               // Redis 7.2 and later, Valkey
		return RefusedPermission
	case strings.Contains(msg, "DB index is out of range"):
		return RefusedDB
	case strings.Contains(msg, "cluster support disabled"):
		return RefusedNotCluster
	case strings.HasPrefix(msg, "READONLY"):
		return RefusedReadOnly
	}
	return NotRefused
}
