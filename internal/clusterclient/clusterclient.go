// Package clusterclient makes the go-redis Cluster client the proxy uses: one that a node
// that hangs cannot hold up while it learns the Cluster's layout. See ADR 0081.
//
// go-redis asks one node at a time, in random order, for the slot layout (CLUSTER SLOTS),
// and, before a first command, for the command table (COMMAND): a node that accepts
// connections and answers nothing (a paused or overloaded master) costs a whole read
// timeout each time it is asked first, and the commands waiting on the answer time out.
// Here the layout is asked of every known node at once, the first answer taken, and the
// command table is not asked for: it serves only go-redis's routing by request policies,
// which no command the proxy sends has (the proxy routes by key, by hash tag).
package clusterclient

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// New returns a Cluster client for o, which it completes: ClusterSlots asks every node
// known (o.Addrs, and the nodes of the last layout) at once, and DisableRoutingPolicies
// spares the command table. Everything else is o's.
//
// go-redis names a node of a layout from ClusterSlots that announces a loopback address
// ":port" (it takes the origin of such a layout for unknown); o.Dialer, wrapped, dials it
// at the address the node announced, so that a TLS server name is the same as before.
func New(o *redis.ClusterOptions) *redis.ClusterClient {
	l := &layout{o: nodeOptions(o), seeds: slices.Clone(o.Addrs), loopback: map[string]string{}}
	dial := o.Dialer
	if dial == nil {
		d := o.DialTimeout
		if d == 0 {
			d = 5 * time.Second // go-redis's default
		}
		dial = redis.NewDialer(&redis.Options{DialTimeout: d, TLSConfig: o.TLSConfig})
	}
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dial(ctx, network, l.announced(addr))
	}
	o.ClusterSlots = l.slots
	o.DisableRoutingPolicies = true
	return redis.NewClusterClient(o)
}

// layout loads the slot layout; mu guards known and loopback.
type layout struct {
	o        redis.Options // a node's, without its address
	seeds    []string
	mu       sync.Mutex
	known    []string          // the nodes of the last layout loaded
	loopback map[string]string // port → a node's loopback address, as announced
}

// announced is addr as its node announced it, where go-redis left its host out.
func (l *layout) announced(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return addr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if a, ok := l.loopback[port]; ok {
		return a
	}
	return addr
}

// nodeOptions are what a client of one node needs of o: how to reach it and log in, and
// how long to wait. No retry: another node answers instead.
func nodeOptions(o *redis.ClusterOptions) redis.Options {
	return redis.Options{
		ClientName: o.ClientName, Dialer: o.Dialer, OnConnect: o.OnConnect, Protocol: o.Protocol,
		Username: o.Username, Password: o.Password, CredentialsProvider: o.CredentialsProvider,
		CredentialsProviderContext: o.CredentialsProviderContext, StreamingCredentialsProvider: o.StreamingCredentialsProvider,
		TLSConfig: o.TLSConfig, DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries,
		DialerRetryTimeout: o.DialerRetryTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled, DisableIdentity: o.DisableIdentity,
		IdentitySuffix: o.IdentitySuffix, MaxRetries: -1, PoolSize: 1,
	}
}

var errNoSlots = errors.New("clusterclient: a node answered CLUSTER SLOTS with no slot")

// slots asks every known node for the layout at once and returns the first answer: a
// node that hangs costs nothing while another answers.
func (l *layout) slots(ctx context.Context) ([]redis.ClusterSlot, error) {
	addrs := l.addrs()
	type answer struct {
		addr  string
		slots []redis.ClusterSlot
		err   error
	}
	answers := make(chan answer, len(addrs)) // the askers that lost end by their read timeout
	for _, a := range addrs {
		go func() {
			o := l.o
			o.Addr = a
			c := redis.NewClient(&o)
			defer c.Close()
			s, err := c.ClusterSlots(ctx).Result()
			if err == nil && len(s) == 0 {
				err = errNoSlots
			}
			answers <- answer{a, s, err}
		}()
	}
	var first error
	for range addrs {
		a := <-answers
		if a.err == nil {
			return l.learn(a.slots, a.addr), nil
		}
		if first == nil {
			first = a.err
		}
	}
	return nil, first
}

// addrs are the seeds and the nodes of the last layout, each once.
func (l *layout) addrs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.seeds)
	for _, a := range l.known {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// learn keeps the nodes of slots, as origin (the node that answered) reaches them: a
// loopback host or a zero port a node announces are origin's, as go-redis takes them.
func (l *layout) learn(slots []redis.ClusterSlot, origin string) []redis.ClusterSlot {
	host, port, _ := net.SplitHostPort(origin)
	var known []string
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range slots {
		nodes := slices.Clone(slots[i].Nodes)
		for j := range nodes {
			a := reach(nodes[j].Addr, host, port)
			nodes[j].Addr = a
			if !slices.Contains(known, a) {
				known = append(known, a)
			}
			if h, p, err := net.SplitHostPort(a); err == nil && loopback(h) {
				l.loopback[p] = a
			}
		}
		slots[i].Nodes = nodes
	}
	l.known = known
	return slots
}

// reach is addr as a client reaches it through origin's host and port.
func reach(addr, originHost, originPort string) string {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() && !loopback(originHost) {
		h = originHost
	}
	if p == "0" && originPort != "" {
		p = originPort
	}
	return net.JoinHostPort(h, p)
}

func loopback(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return host == "localhost"
}
