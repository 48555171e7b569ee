// Package redistest runs a real redis-server on a free loopback port for tests, and holds
// the small helpers the tests that start servers share (WaitUntil, FreeAddr).
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process. Stop, Start, Pause and Resume inject faults.
type Server struct {
	t       testing.TB
	Addr    string
	port    int
	dir     string
	persist bool
	args    []string // more redis-server arguments, such as a cluster node's
	pass    string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Options of a Server.
type Options struct {
	// Persist turns on the append-only file, so that a restart keeps the data.
	Persist bool
	// Args are more redis-server arguments, such as "--maxclients", "100".
	Args []string
	// Password, if set, is required of clients (requirepass); Client uses it.
	Password string
}

// Start runs a redis-server for the test and stops it in t.Cleanup. There is no skipping:
// a machine without redis-server fails the test, saying how to install it.
func Start(t testing.TB, opts ...Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH: install it (Debian: apt-get install redis-server; or run `make test`, which does)")
	}
	_ = bin
	s := &Server{t: t, dir: t.TempDir()}
	if len(opts) > 0 {
		s.persist, s.pass = opts[0].Persist, opts[0].Password
		s.args = append(s.args, opts[0].Args...)
	}
	for i := 0; ; i++ {
		s.port = freePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		err := s.start()
		if err == nil {
			break
		}
		if i == 4 {
			t.Fatalf("redis-server: %v", err)
		}
	}
	t.Cleanup(func() { s.kill() })
	return s
}

func freePort(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(FreeAddr(t))
	p, _ := strconv.Atoi(port)
	return p
}

func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}
	if s.pass != "" {
		args = append(args, "--requirepass", s.pass)
	}
	if s.persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, s.args...)
	cmd := exec.Command("redis-server", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("exited at start: %s", log)
		default:
		}
		c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.pass, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // polling a starting process: there is no event to wait on
	}
	s.kill()
	return errors.New("did not answer PING within 10s")
}

// Client returns a client of the server, closed in t.Cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.pass, DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, MaxRetries: 1})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Stop kills the server (SIGKILL: no goodbye to clients) and waits until it has exited.
func (s *Server) Stop() { s.kill() }

// Restart starts the server again on the same port, with its data if it persists.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("redis-server restart: %v", err)
	}
}

// Pause stops the server process (SIGSTOP); Resume continues it.
func (s *Server) Pause()  { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	<-s.exited
}
