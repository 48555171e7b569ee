package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of real redis-server processes on loopback ports: masters,
// each with its replicas, created by redis-cli --cluster create. Killing a master makes
// one of its replicas take over its slots after NodeTimeout, as in production.
type Cluster struct {
	t     testing.TB
	Nodes []*Server // every node, masters and replicas, in the order they were started
}

// ClusterOptions of a Cluster.
type ClusterOptions struct {
	// Masters is the number of masters, which share the 16384 slots. If zero, 3.
	Masters int
	// Replicas is the number of replicas of each master; zero means none.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a master may be unreachable before the
	// cluster fails it over. If zero, 1s.
	NodeTimeout time.Duration
	// PartialCoverage sets cluster-require-full-coverage no: while a master is failed and
	// not replaced yet, the other masters keep serving their own slots. Redis's default
	// (false here) makes every node refuse every key in that window.
	PartialCoverage bool
}

// StartCluster starts Masters × (1 + Replicas) nodes, makes them a cluster, and waits
// until every node says cluster_state:ok, knows every other node, and every replica's
// link to its master is up. Every node is killed with its process group in t.Cleanup.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found on PATH: install it (Debian: apt-get install redis-server, which brings redis-tools with redis-cli; or run `make test`, which does)", bin)
		}
	}
	if o.Masters == 0 {
		o.Masters = 3
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = time.Second
	}
	c := &Cluster{t: t}
	for range o.Masters * (1 + o.Replicas) {
		c.Nodes = append(c.Nodes, c.startNode(o))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.waitUntil(30*time.Second, "cluster formed", func() (bool, string) { return c.formed(o) })
	return c
}

// startNode starts one cluster-enabled redis-server. Its cluster bus listens on its port
// + 10000 (the default, which every supported server version knows), so both must be free.
func (c *Cluster) startNode(o ClusterOptions) *Server {
	c.t.Helper()
	s := &Server{t: c.t, dir: c.t.TempDir()}
	s.args = []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
		"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
	}
	if o.PartialCoverage {
		s.args = append(s.args, "--cluster-require-full-coverage", "no")
	}
	for i := 0; ; i++ {
		s.port = clusterPort(c.t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		err := s.start()
		if err == nil {
			break
		}
		if i == 4 {
			c.t.Fatalf("redis-server (cluster node): %v", err)
		}
	}
	c.t.Cleanup(s.killGroup)
	return s
}

// clusterPort returns a free port p whose bus port p+10000 is free too, both below the
// usual range of ephemeral ports (32768 and up), so that no outgoing connection takes them.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 200 {
		p := 10000 + rand.IntN(12000)
		if portFree(p) && portFree(p+10000) {
			return p
		}
	}
	t.Fatal("no free pair of ports p, p+10000 for a cluster node")
	return 0
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// killGroup kills the node and its process group (a replica's sync may have forked a child).
func (s *Server) killGroup() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited: // gone: its group id may belong to someone else by now
	default:
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	s.kill()
}

// Alive reports whether the node's process is running.
func (s *Server) Alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Addrs are the addresses of every node, for a client's seed list.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Nodes {
		a = append(a, s.Addr)
	}
	return a
}

// Client returns a cluster client seeded with every node, closed in t.Cleanup.
func (c *Cluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second})
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// Kill is kill -9 of a node (and its process group): no goodbye to clients or to the
// cluster, which notices after NodeTimeout.
func (c *Cluster) Kill(s *Server) { s.killGroup() }

// ask runs f against one running node (a fresh connection each time, so that a killed
// node is never asked again).
func (c *Cluster) ask(s *Server, f func(ctx context.Context, r *redis.Client) error) error {
	r := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, MaxRetries: -1})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return f(ctx, r)
}

func (c *Cluster) alive() []*Server {
	var a []*Server
	for _, s := range c.Nodes {
		if s.Alive() {
			a = append(a, s)
		}
	}
	return a
}

// byAddr finds a node by the address a node announced (matched by port: the host part
// is the loopback address every node binds).
func (c *Cluster) byAddr(addr string) *Server {
	_, port, _ := net.SplitHostPort(addr)
	for _, s := range c.Nodes {
		if strconv.Itoa(s.port) == port {
			return s
		}
	}
	return nil
}

// Slot is the cluster slot of key (CLUSTER KEYSLOT: CRC16 of the key, or of its {hash
// tag}, modulo 16384).
func (c *Cluster) Slot(key string) (int, error) {
	var slot int64
	err := c.ask(c.alive()[0], func(ctx context.Context, r *redis.Client) (err error) {
		slot, err = r.ClusterKeySlot(ctx, key).Result()
		return err
	})
	return int(slot), err
}

// masterOfSlot is the master serving slot in s's view of the cluster (CLUSTER SLOTS).
func (c *Cluster) masterOfSlot(s *Server, slot int) (*Server, error) {
	var ranges []redis.ClusterSlot
	if err := c.ask(s, func(ctx context.Context, r *redis.Client) (err error) {
		ranges, err = r.ClusterSlots(ctx).Result()
		return err
	}); err != nil {
		return nil, err
	}
	for _, rg := range ranges {
		if slot >= rg.Start && slot <= rg.End && len(rg.Nodes) > 0 {
			if m := c.byAddr(rg.Nodes[0].Addr); m != nil {
				return m, nil
			}
			return nil, fmt.Errorf("slot %d: master %s is not a node of this cluster", slot, rg.Nodes[0].Addr)
		}
	}
	return nil, fmt.Errorf("slot %d: served by no master in %s's view", slot, s.Addr)
}

// MasterOf is the master serving key's slot, as a running node sees it.
func (c *Cluster) MasterOf(key string) (*Server, error) {
	slot, err := c.Slot(key)
	if err != nil {
		return nil, err
	}
	return c.masterOfSlot(c.alive()[0], slot)
}

// Masters are the nodes serving slots, as a running node sees it.
func (c *Cluster) Masters() ([]*Server, error) {
	var ranges []redis.ClusterSlot
	if err := c.ask(c.alive()[0], func(ctx context.Context, r *redis.Client) (err error) {
		ranges, err = r.ClusterSlots(ctx).Result()
		return err
	}); err != nil {
		return nil, err
	}
	var ms []*Server
	seen := map[*Server]bool{}
	for _, rg := range ranges {
		if m := c.byAddr(rg.Nodes[0].Addr); m != nil && !seen[m] {
			seen[m] = true
			ms = append(ms, m)
		}
	}
	return ms, nil
}

// WaitServed waits until Served answers, and returns the master: after a master was
// killed, this is when its replica has been promoted and the cluster agrees. It fails the
// test after d.
func (c *Cluster) WaitServed(key string, d time.Duration) *Server {
	c.t.Helper()
	var master *Server
	c.waitUntil(d, fmt.Sprintf("%s served by a running master", key), func() (bool, string) {
		m, err := c.Served(key)
		if err != nil {
			return false, err.Error()
		}
		master = m
		return true, ""
	})
	return master
}

// Served returns the running master that serves key's slot if every running node says
// cluster_state:ok and agrees on it; otherwise an error says what is not so yet. It does
// not fail the test, so that another goroutine may watch a failover with it.
func (c *Cluster) Served(key string) (*Server, error) {
	slot, err := c.Slot(key)
	if err != nil {
		return nil, fmt.Errorf("CLUSTER KEYSLOT %s: %w", key, err)
	}
	var master *Server
	for _, s := range c.alive() {
		if ok, info := c.stateOK(s); !ok {
			return nil, errors.New(info)
		}
		m, err := c.masterOfSlot(s, slot)
		if err != nil {
			return nil, err
		}
		if !m.Alive() || (master != nil && m != master) {
			return nil, fmt.Errorf("%s sees slot %d on %s (running %v)", s.Addr, slot, m.Addr, m.Alive())
		}
		master = m
	}
	return master, nil
}

// stateOK reports whether node s says cluster_state:ok.
func (c *Cluster) stateOK(s *Server) (bool, string) {
	var info string
	if err := c.ask(s, func(ctx context.Context, r *redis.Client) (err error) {
		info, err = r.ClusterInfo(ctx).Result()
		return err
	}); err != nil {
		return false, fmt.Sprintf("%s: %v", s.Addr, err)
	}
	return strings.Contains(info, "cluster_state:ok\r\n"), s.Addr + ": " + strings.ReplaceAll(firstLine(info), "\r", "")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// formed reports whether the new cluster is whole: every node ok, knowing every node, all
// slots served by o.Masters masters, and every replica's link to its master up.
func (c *Cluster) formed(o ClusterOptions) (bool, string) {
	n := len(c.Nodes)
	up := 0
	for _, s := range c.Nodes {
		var info, repl string
		if err := c.ask(s, func(ctx context.Context, r *redis.Client) (err error) {
			if info, err = r.ClusterInfo(ctx).Result(); err != nil {
				return err
			}
			repl, err = r.Info(ctx, "replication").Result()
			return err
		}); err != nil {
			return false, fmt.Sprintf("%s: %v", s.Addr, err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:16384", fmt.Sprintf("cluster_known_nodes:%d", n), fmt.Sprintf("cluster_size:%d", o.Masters)} {
			if !strings.Contains(info, want+"\r\n") {
				return false, fmt.Sprintf("%s: no %s in CLUSTER INFO", s.Addr, want)
			}
		}
		if strings.Contains(repl, "role:slave") && strings.Contains(repl, "master_link_status:up") {
			up++
		}
	}
	if up != o.Masters*o.Replicas {
		return false, fmt.Sprintf("%d replicas linked to their master; want %d", up, o.Masters*o.Replicas)
	}
	return true, ""
}

// waitUntil is WaitUntil for the cluster's test.
func (c *Cluster) waitUntil(d time.Duration, what string, cond func() (bool, string)) {
	c.t.Helper()
	WaitUntil(c.t, d, "redis cluster: "+what, cond)
}
