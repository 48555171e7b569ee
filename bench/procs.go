package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process the harness started and must stop.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // its stderr (and stdout unless read), for when it fails
	done chan struct{}
}

// procs owns every child process; stopAll ends them, newest first.
type procs struct{ list []*proc }

func (ps *procs) start(name, dir string, env []string, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); lf.Close(); close(p.done) }()
	ps.list = append(ps.list, p)
	return p, nil
}

// stop sends SIGTERM to p's process group and SIGKILL if it has not exited within 5s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// tail is the end of p's log, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func (ps *procs) stopAll() {
	for i := len(ps.list) - 1; i >= 0; i-- {
		ps.list[i].stop()
	}
	ps.list = nil
}

func (ps *procs) remove(p *proc) {
	p.stop()
	for i, q := range ps.list {
		if q == p {
			ps.list = append(ps.list[:i], ps.list[i+1:]...)
			return
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// waitHTTP polls url until it answers 200 (a starting process has no event to wait on).
func waitHTTP(ctx context.Context, p *proc, url string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited at start:\n%s", p.name, p.tail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer %s within 15s:\n%s", p.name, url, p.tail())
}

// buildBinaries builds the proxy and the fake upstream into dir. The proxy is built with
// -tags pprof, so that the profiles are taken of the real binary (it serves pprof only
// where LLM_DEDUPE_PPROF_LISTEN is set; see cmd/llm-dedupe-proxy/pprof.go).
func buildBinaries(ctx context.Context, dir string) (proxyBin, fakeBin string, err error) {
	proxyBin, fakeBin = filepath.Join(dir, "llm-dedupe-proxy"), filepath.Join(dir, "fakeupstream")
	for _, b := range [][3]string{{proxyBin, "./cmd/llm-dedupe-proxy", "pprof"}, {fakeBin, "./e2e/fakeupstream", ""}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", b[2], "-o", b[0], b[1])
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	return proxyBin, fakeBin, nil
}

// startFake runs the fake upstream and returns its base URL; with a certificate file, over
// HTTPS (see e2e/fakeupstream), its certificate written there.
func startFake(ps *procs, dir, bin string, certFile ...string) (*proc, string, error) {
	args, scheme := []string{"-listen", "127.0.0.1:0"}, "http://"
	if len(certFile) > 0 {
		args, scheme = append(args, "-tls-cert", certFile[0]), "https://"
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	logPath := filepath.Join(dir, "fakeupstream.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = lf
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	p := &proc{name: "fakeupstream", cmd: cmd, log: logPath, done: make(chan struct{})}
	ps.list = append(ps.list, p)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return nil, "", fmt.Errorf("fakeupstream: reading its address: %w", err)
	}
	go func() { io.Copy(io.Discard, out); _ = cmd.Wait(); lf.Close(); close(p.done) }()
	return p, scheme + strings.TrimSpace(line), nil
}

// startRedis runs a redis-server without persistence and returns its address.
func startRedis(ctx context.Context, ps *procs, dir string) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return nil, "", err
	}
	p, err := ps.start("redis", dir, nil, "redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", rdir, "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
		"--maxclients", "60000")
	if err != nil {
		return nil, "", err
	}
	addr := loopback(port)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return p, addr, nil
		}
		select {
		case <-p.done:
			return nil, "", fmt.Errorf("redis-server exited at start:\n%s", p.tail())
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, "", errors.New("redis-server did not listen within 10s")
}

// startProxy runs one llm-dedupe-proxy instance configured through its environment, as an
// operator would, and waits until it is ready.
func startProxy(ctx context.Context, ps *procs, dir, bin, name, upstream, redisAddr string, extraEnv ...string) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	env := []string{
		"LLM_DEDUPE_LISTEN=" + loopback(port),
		"LLM_DEDUPE_UPSTREAM_BASE_URL=" + upstream,
		"LLM_DEDUPE_REDIS_ADDRS=" + redisAddr, // empty: the in-memory backend
		"LLM_DEDUPE_FLIGHT_RESULT_TTL=10m",
		"LLM_DEDUPE_LOG_LEVEL=warn",
	}
	p, err := ps.start(name, dir, append(env, extraEnv...), bin, "serve")
	if err != nil {
		return nil, "", err
	}
	base := "http://" + loopback(port)
	if err := waitHTTP(ctx, p, base+"/readyz"); err != nil {
		return nil, "", err
	}
	return p, base, nil
}

// rssBytes is the resident set size of a process, from /proc.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

// raiseFileLimit lifts RLIMIT_NOFILE (inherited by every child) so that 10k waiting
// clients fit; as root the hard limit may be raised too. It returns the limit in force.
func raiseFileLimit(want uint64) uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	if l.Cur >= want {
		return l.Cur
	}
	n := syscall.Rlimit{Cur: want, Max: max(want, l.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
		n = syscall.Rlimit{Cur: l.Max, Max: l.Max}
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n)
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	return l.Cur
}

// tcpConnsTo counts the established TCP connections of process pid to addr's port, from
// /proc: the process's socket inodes matched against its network namespace's tables.
// Redis's own client count covers every process connected to it (the harness, the idle
// instances of the other measurements); this is one process's share.
func tcpConnsTo(pid int, addr string) int {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return 0
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, ent := range ents {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, ent.Name()))
		if ino, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[2], want) && f[3] == "01" && inodes[f[9]] {
				n++
			}
		}
	}
	return n
}

// cpuTime is the CPU time (user and system) process pid has used so far, from
// /proc/pid/stat (pid 0: this process).
func cpuTime(pid int) (time.Duration, error) {
	path := "/proc/self/stat"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces: count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no ')'", path)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields", path, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] { // utime and stime, fields 14 and 15
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/pid/stat's times: 100 on Linux everywhere.
const clockTicks = 100
