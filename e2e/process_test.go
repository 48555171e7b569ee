package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one process the test started, in its own process group. Its stderr (and stdout)
// lines are kept, shown in the test log if the test fails, and can be waited for.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced when a line arrives or the process exits
	exited  bool
	status  int // exit status once exited (-1: killed by a signal)
	done    chan struct{}
}

// maxLogLines bounds what a failed test prints per process: its last lines.
const maxLogLines = 300

// startProc starts bin with args and env (nothing else from the test's environment but
// PATH and HOME), kills its process group in t.Cleanup, and logs its output if t failed.
func startProc(t testing.TB, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + t.TempDir()}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, changed: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var readers sync.WaitGroup
	readers.Go(func() { p.read(stdout) })
	readers.Go(func() { p.read(stderr) })
	go func() {
		readers.Wait() // Wait closes the pipes: read them to the end first
		err := cmd.Wait()
		p.mu.Lock()
		p.exited, p.status = true, exitStatus(err)
		p.notify()
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.lines {
			if strings.Contains(l, "WARNING: DATA RACE") {
				t.Errorf("%s: the race detector found a data race; its log follows", name)
				break
			}
		}
		if !t.Failed() {
			return
		}
		lines := p.lines
		if len(lines) > maxLogLines { // the request lines go first: the others say why
			var others []string
			for _, l := range lines {
				if !strings.Contains(l, `"msg":"request"`) {
					others = append(others, l)
				}
			}
			if len(others) < len(lines) {
				t.Logf("---- %s: %d request lines left out ----", name, len(lines)-len(others))
				lines = others
			}
		}
		if len(lines) > maxLogLines {
			t.Logf("---- %s: %d earlier lines left out ----", name, len(lines)-maxLogLines)
			lines = lines[len(lines)-maxLogLines:]
		}
		t.Logf("---- %s (pid %d) output ----\n%s", name, cmd.Process.Pid, strings.Join(lines, "\n"))
	})
	return p
}

func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		p.notify()
		p.mu.Unlock()
	}
}

// notify wakes waiters; p.mu must be held.
func (p *proc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// waitLine waits until a line of output (from line index from on) satisfies match, and
// returns it with its index. It fails the test after d or when the process exits first.
func (p *proc) waitLine(from int, d time.Duration, what string, match func(string) bool) (string, int) {
	p.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		for i := from; i < len(p.lines); i++ {
			if match(p.lines[i]) {
				l := p.lines[i]
				p.mu.Unlock()
				return l, i
			}
		}
		from = len(p.lines)
		exited, ch := p.exited, p.changed
		p.mu.Unlock()
		if exited {
			p.t.Fatalf("%s exited (status %d) before it logged %s", p.name, p.exitCode(), what)
		}
		select {
		case <-ch:
		case <-timer.C:
			p.t.Fatalf("%s did not log %s within %v", p.name, what, d)
		}
	}
}

// logLine is a line of the proxy's JSON log.
type logLine map[string]any

func parseLog(l string) logLine {
	var m logLine
	if json.Unmarshal([]byte(l), &m) != nil {
		return nil
	}
	return m
}

// msgIs matches a JSON log line whose msg is msg.
func msgIs(msg string) func(string) bool {
	return func(l string) bool { return parseLog(l)["msg"] == msg }
}

// signal sends sig to the process (not its group: the group is for the cleanup).
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// wait waits for the process to exit and returns its status; it fails the test after d.
func (p *proc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.exitCode()
	case <-time.After(d):
		p.t.Fatalf("%s still running %v after it was told to stop", p.name, d)
		return 0
	}
}

func (p *proc) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// kill ends the whole process group at once (continuing it first if it was stopped) and
// waits for the process.
func (p *proc) kill() {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("%s: not gone 10s after SIGKILL", p.name)
	}
}
