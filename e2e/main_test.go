package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Binaries built once by TestMain for every test of the package.
var (
	proxyBin string // llm-dedupe-proxy
	fakeBin  string // the fake OpenAI upstream
	repoRoot string // the module root, for the files the deploy tests read
)

// TestMain builds the proxy and the fake upstream into a temporary directory. With
// E2E_RACE=1 the proxy is built with the race detector, so that the multi-process scenarios
// also hunt data races (slower: several times the CPU on a small machine).
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "llm-dedupe-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	repoRoot = filepath.Dir(wd)
	proxyBin = filepath.Join(dir, "llm-dedupe-proxy")
	fakeBin = filepath.Join(dir, "fakeupstream")
	proxyArgs := []string{"build", "-trimpath", "-ldflags", "-X main.version=e2e", "-o", proxyBin}
	if os.Getenv("E2E_RACE") == "1" {
		proxyArgs = append(proxyArgs, "-race")
	}
	builds := [][]string{
		append(proxyArgs, "./cmd/llm-dedupe-proxy"),
		{"build", "-o", fakeBin, "./e2e/fakeupstream"},
	}
	for _, args := range builds {
		cmd := exec.Command("go", args...) // go test puts its own GOROOT/bin first on PATH
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo(args))
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go %v: %v\n%s", args, err, out)
			return 1
		}
	}
	return m.Run()
}

// cgo is off (a static binary, as in the image) unless the race detector needs it.
func cgo(args []string) string {
	for _, a := range args {
		if a == "-race" {
			return "1"
		}
	}
	return "0"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
