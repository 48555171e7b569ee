package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// readmeSections are the parts of README.md whose console examples a newcomer runs, each
// in a shell of its own: with no API key, then sampled requests on the same instance,
// then two instances on one Redis, then the admin API of a third, then traces of two more
// written to files. Each stands alone but for the servers an earlier one started (the
// fake upstream, and Redis on 6379).
var readmeSections = []string{"## Try it without an API key", "### Sampled requests", "## Several instances", "### Admin API", "### Traces"}

// readmePorts are the ports the README's examples use; the test gives each a free one.
var readmePorts = []string{"6379", "8080", "8081", "8082", "8083", "8084", "8085", "9000", "9091"}

// step is one command of a console example and the lines it prints.
type step struct {
	cmd  string
	want []string
}

// TestReadmeExamples runs the README's console examples from "Try it without an API key" to
// the traces, each section in a fresh bash, one after the other, as a newcomer would paste
// them, with the built binary for `go run ./cmd/llm-dedupe-proxy`, free ports for the
// README's, and a redis-server of the test's for the one on 6379. Each command must print
// what the README shows under it, up to what changes from run to run (dates, ages,
// durations, ids): no API key, one upstream call per burst, every tool's output taken as
// the next one's input, no section using a variable another set, and nothing written in
// the directory the examples run in.
func TestReadmeExamples(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl not found on PATH: the README's examples use it (Debian: apt-get install curl)")
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := make([][]step, len(readmeSections))
	for i, s := range readmeSections {
		if sections[i] = consoleSteps(t, string(raw), s); len(sections[i]) == 0 {
			t.Fatalf("README.md: no console example under %q", s)
		}
	}

	rs := redistest.Start(t)
	ports := map[string]string{"6379": strings.TrimPrefix(rs.Addr, "127.0.0.1:")}
	for _, p := range readmePorts[1:] {
		ports[p] = strings.TrimPrefix(redistest.FreeAddr(t), "127.0.0.1:")
	}
	portRE := regexp.MustCompile(`\b(` + strings.Join(readmePorts, "|") + `)\b`)
	local := func(s string) string {
		return portRE.ReplaceAllStringFunc(s, func(p string) string { return ports[p] })
	}

	out, work := t.TempDir(), t.TempDir() // the steps' output; where the examples run
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + t.TempDir(), "TMPDIR=" + t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, runErr := 0, error(nil)
	for i, steps := range sections {
		var script strings.Builder
		for _, s := range steps {
			fmt.Fprintf(&script, "{ %s\n} >%s 2>&1\n", testCommand(local(s.cmd), ports), filepath.Join(out, strconv.Itoa(n)))
			n++
		}
		sh := exec.CommandContext(ctx, "bash", "-c", script.String())
		sh.Env, sh.Dir = env, work
		sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		sh.Cancel = func() error { return syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) }
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		// The proxies and the fake upstream go on in the background, in the shell's process
		// group, after the shell exits: the later sections use them.
		t.Cleanup(func() { _ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) })
		if err := sh.Wait(); err != nil {
			runErr = fmt.Errorf("%s: %v", readmeSections[i], err)
			break
		}
	}

	n = 0
	for _, steps := range sections {
		for _, s := range steps {
			b, _ := os.ReadFile(filepath.Join(out, strconv.Itoa(n)))
			n++
			got, want := normalized(string(b)), normalized(local(strings.Join(s.want, "\n")))
			if !slices.Equal(got, want) {
				t.Errorf("$ %s\nprinted\n%s\nwhere the README shows\n%s", s.cmd, b, strings.Join(s.want, "\n"))
			}
		}
	}
	if runErr != nil {
		t.Errorf("the README's commands did not all run within 2 minutes: %v", runErr)
	}
	if left, _ := os.ReadDir(work); len(left) > 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("the README's examples left %v in the directory they ran in; want nothing", names)
	}
}

// testCommand is a README command as the test runs it: with the built binary, and every
// server on loopback, on the test's ports: a listen address without a host gets
// 127.0.0.1, and the two servers the README starts on their default addresses (the fake
// upstream's 127.0.0.1:9000, the proxy's :8080) are given the test's.
func testCommand(cmd string, ports map[string]string) string {
	const goRun = "go run ./cmd/llm-dedupe-proxy"
	cmd = strings.ReplaceAll(cmd, "--listen=:", "--listen=127.0.0.1:")
	cmd = strings.ReplaceAll(cmd, goRun+" fake-upstream", goRun+" fake-upstream --listen=127.0.0.1:"+ports["9000"])
	if strings.Contains(cmd, goRun+" --") && !strings.Contains(cmd, "--listen=") {
		cmd = strings.Replace(cmd, goRun, goRun+" --listen=127.0.0.1:"+ports["8080"], 1)
	}
	return strings.ReplaceAll(cmd, goRun, proxyBin)
}

// consoleSteps returns the commands of the console blocks under heading, each with the
// lines shown after it: a line "$ …" starts a command, the lines of a command left
// unfinished continue it, "# …" lines are comments, and other lines are its output.
func consoleSteps(t *testing.T, readme, heading string) []step {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no heading %q", heading)
	}
	// The section ends at the next heading of its level or above, outside code blocks,
	// where "# " starts a comment.
	level := strings.Index(heading, " ")
	end := regexp.MustCompile(`^#{1,` + strconv.Itoa(level) + `} `)
	var section strings.Builder
	fenced := false
	for _, line := range strings.Split(readme[i+len(heading)+2:], "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if !fenced && end.MatchString(line) {
			break
		}
		section.WriteString(line + "\n")
	}
	var steps []step
	for _, block := range regexp.MustCompile("(?s)```console\n(.*?)```").FindAllStringSubmatch(section.String(), -1) {
		for _, line := range strings.Split(strings.TrimSuffix(block[1], "\n"), "\n") {
			switch {
			case strings.HasPrefix(line, "$ "):
				steps = append(steps, step{cmd: strings.TrimPrefix(line, "$ ")})
			case strings.HasPrefix(line, "# ") || line == "":
			case len(steps) > 0 && unfinished(steps[len(steps)-1]):
				steps[len(steps)-1].cmd += "\n" + line
			case len(steps) > 0:
				steps[len(steps)-1].want = append(steps[len(steps)-1].want, line)
			}
		}
	}
	return steps
}

// unfinished reports whether s's command goes on on the next line: it ends with a
// backslash or leaves a parenthesis open, as a subshell around a loop does.
func unfinished(s step) bool {
	return len(s.want) == 0 && (strings.HasSuffix(s.cmd, "\\") || strings.Count(s.cmd, "(") > strings.Count(s.cmd, ")"))
}

// What changes from run to run in the README's outputs, and what stands for it.
var variable = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`^Date: .*`), "Date: DATE"},
	{regexp.MustCompile(`^Age: \d+`), "Age: N"},
	{regexp.MustCompile(`"(age_ms|lease_left_ms|generation)":\d+`), `"$1":N`},
	{regexp.MustCompile(`\b\d+(\.\d+)?(µs|ms|s)\b`), "DURATION"},
	{regexp.MustCompile(`\b[0-9a-f]{32}\b`), "TRACE"},    // a trace id
	{regexp.MustCompile(`\b[0-9a-f]{16}\b`), "SPAN"},     // a span id
	{regexp.MustCompile(`\b[0-9a-f]{12}\b`), "INSTANCE"}, // an instance id: a key has 64 digits
	{regexp.MustCompile(`\s+`), " "},
}

// normalized returns the non-empty lines of out, with what changes from run to run
// replaced, in sorted order: ids sort differently from run to run.
func normalized(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(strings.TrimSuffix(l, "\r"))
		if l == "" {
			continue
		}
		for _, v := range variable {
			l = v.re.ReplaceAllString(l, v.with)
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return lines
}
