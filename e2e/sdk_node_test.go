package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// nodeSDK is the version of the npm package "openai" the test installs. The 7.x line needs
// Node 22; 6.x runs on the Node 18 and 20 of Debian and NodeSource packages.
const nodeSDK = "openai@6.49.0"

// installNodeSDK installs the Node SDK into a fresh directory (never into the repository)
// and returns the directory, with the scripts of e2e/node copied in so that they find the
// package.
func installNodeSDK(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found on PATH: the Node SDK test needs it (Debian: apt-get install nodejs npm; or run `make test`, which installs it)", tool)
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-save", "--no-package-lock", "--no-audit", "--no-fund",
		"--loglevel=error", "--prefix", dir, nodeSDK)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install %s failed (the npm registry must be reachable): %v\n%s", nodeSDK, err, out)
	}
	scripts, err := filepath.Glob(filepath.Join(repoRoot, "e2e", "node", "*.mjs"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in e2e/node (%v)", err)
	}
	for _, script := range scripts {
		src, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(script)), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// nodeOutput is what client.mjs prints.
type nodeOutput struct {
	Chat []struct {
		Raw, ID, Content, Role, RequestID string
		Usage                             map[string]int
	}
	Stream []struct {
		Chunks                   []string
		Content, Role, RequestID string
		Usage                    map[string]int
	}
	Embeddings []struct {
		Raw, Role, RequestID string
		Embedding            []float64
		Usage                map[string]int
	}
}

// TestNodeSDK: the official Node SDK, through three instances, sees exactly what the
// upstream sent for chat, streamed chat and embeddings; identical requests sent at once
// from six clients cost one upstream call per kind and come back identical.
func TestNodeSDK(t *testing.T) {
	dir := installNodeSDK(t)
	c := startCluster(t, clusterOpts{})
	const chunks, perBase = 3, 2
	// A slow upstream, so that the six identical requests share a flight; any that comes
	// later is served the stored answer, the same bytes.
	c.fake.set(fakeupstream.Behavior{Delay: 100 * time.Millisecond, Chunks: chunks})
	model := "e2e-node-sdk"
	var bases []string
	for _, in := range c.ins {
		bases = append(bases, in.URL+"/v1")
	}
	cfg, _ := json.Marshal(map[string]any{"bases": bases, "apiKey": apiKeyA, "model": model, "perBase": perBase})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "client.mjs"), string(cfg))
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs: %v\nstderr:\n%s", err, stderr.String())
	}
	var out nodeOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("node client.mjs printed %q: %v", stdout.String(), err)
	}
	const n = perBase * 3
	if len(out.Chat) != n || len(out.Stream) != n || len(out.Embeddings) != n {
		t.Fatalf("node client.mjs: %d chat, %d stream, %d embedding answers; want %d each", len(out.Chat), len(out.Stream), len(out.Embeddings), n)
	}

	// The kinds ran one after the other: upstream calls 1, 2 and 3.
	chatWant := fakeupstream.Unary(chatPath, 1, model)
	for i, a := range out.Chat {
		if a.Raw != chatWant || a.ID != "chatcmpl-1" || a.Content != "reply 1" || a.RequestID != "req_1" ||
			a.Usage["prompt_tokens"] != 11 || a.Usage["completion_tokens"] != 7 || a.Usage["total_tokens"] != 18 {
			t.Errorf("Node chat %d saw %+v; want exactly %s", i, a, chatWant)
		}
	}
	var streamWant []string
	for _, ev := range fakeupstream.StreamEvents(chatPath, 2, model, chunks, true) {
		if d := strings.TrimSuffix(strings.TrimPrefix(ev.Text, "data: "), "\n\n"); d != "[DONE]" {
			streamWant = append(streamWant, d)
		}
	}
	for i, s := range out.Stream {
		if !slices.Equal(s.Chunks, streamWant) || s.Content != "tok0 tok1 tok2 " || s.RequestID != "req_2" ||
			s.Usage["prompt_tokens"] != 11 || s.Usage["completion_tokens"] != chunks {
			t.Errorf("Node stream %d saw %+v;\nwant chunks %q", i, s, streamWant)
		}
	}
	embedWant := fakeupstream.Unary(embedPath, 3, model)
	for i, e := range out.Embeddings {
		if e.Raw != embedWant || !slices.Equal(e.Embedding, []float64{3, 0.5, -0.25}) || e.RequestID != "req_3" || e.Usage["prompt_tokens"] != 5 {
			t.Errorf("Node embedding %d saw %+v; want exactly %s", i, e, embedWant)
		}
	}
	roleCount := map[string]int{}
	for _, a := range out.Chat {
		roleCount[a.Role]++
	}
	for _, s := range out.Stream {
		roleCount[s.Role]++
	}
	for _, e := range out.Embeddings {
		roleCount[e.Role]++
	}
	if roleCount["owner"] != 3 || roleCount["follower"]+roleCount["hit"] != 3*(n-1) {
		t.Errorf("roles %v; want 3 owners (one per kind), the other %d followers or hits", roleCount, 3*(n-1))
	}
	if s := c.fake.stats(); s.Calls != 3 {
		t.Errorf("upstream %+v; want 3 calls (one per kind) for %d identical SDK requests of each", s, n)
	}
	t.Logf("NODE %s via %s: roles %v", nodeSDK, mustOutput(t, "node", "--version"), roleCount)
}

func mustOutput(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return strings.TrimSpace(string(out))
}
