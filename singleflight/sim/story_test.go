package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Stories: the questions a maintainer asks about the protocol, each a scenario run under
// the virtual clock, whose timeline is kept in testdata/stories/NAME.txt and checked on
// every run. go test ./singleflight/sim -run TestStories -update rewrites them.

var update = flag.Bool("update", false, "rewrite the stories' golden timelines")

// story is one scenario and the question it answers.
type story struct {
	name  string
	about string // the question, and what to look for
	cfg   config
	drive func(w *world)
	// settle is how long the world runs on once every client is done.
	settle time.Duration
}

// quiet shows every Redis command but a renewal that renewed, an alive message, and the
// NOSCRIPT that makes go-redis send a script the server does not have yet.
func quiet(name, reply string) bool {
	return !(name == "renew" && reply == "renewed") && name != "publish" && reply != "noscript"
}

func TestStories(t *testing.T) {
	for _, s := range stories() {
		t.Run(s.name, func(t *testing.T) {
			// Run twice: a story whose timeline depends on how goroutines were scheduled
			// at one instant tells nothing.
			var got string
			for run := range 2 {
				seedGlobal(s.cfg.seed)
				synctest.Test(t, func(t *testing.T) {
					if s.cfg.verbose == nil {
						s.cfg.verbose = quiet
					}
					w := newWorld(t, s.cfg)
					s.drive(w)
					w.run(s.settle)
					for _, v := range w.viol {
						t.Errorf("invariant broken: %s", v)
					}
					text := storyText(s, w)
					if run > 0 && text != got {
						t.Errorf("two runs told the story differently:\n%s", diff(got, text))
					}
					got = text
				})
			}
			path := filepath.Join("testdata", "stories", s.name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./singleflight/sim -run TestStories -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("the story's timeline changed; go test ./singleflight/sim -run 'TestStories/%s' -update rewrites it.\n%s",
					s.name, diff(string(want), got))
			}
		})
	}
}

// storyText is a story's golden file: its question, its deployment, and its timeline.
func storyText(s story, w *world) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(s.about), "\n") {
		fmt.Fprintf(&b, "# %s\n", strings.TrimSpace(l))
	}
	topo := "one Redis server"
	switch {
	case w.cfg.masters > 0:
		topo = fmt.Sprintf("a Redis Cluster of %d masters", w.cfg.masters)
	case w.cfg.masters < 0:
		topo = "no Redis (in memory)"
	}
	o := w.cfg.opts
	fmt.Fprintf(&b, "#\n# %d instances, %s; lease %s, heartbeat %s, jitter up to %s, grace %s, Redis timeout %s.\n",
		w.cfg.instances, topo, o.LeaseTTL, o.HeartbeatInterval, o.TakeoverJitter, o.AbandonGrace, o.RedisTimeout)
	b.WriteString("# Columns: virtual time, instance, event, the file:function of the project's code that made it.\n\n")
	b.WriteString(timeline(w.hist.all(), time.Millisecond, kClient, kCall, kFlight, kRedis, kFault))
	return b.String()
}

// diff shows the first lines where two timelines part.
func diff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, w, g)
		}
	}
	return ""
}

// TestStoriesTheDocsName: every story walkthroughs.md names exists, and every story is
// named there, so that the prose and the timelines point at each other.
func TestStoriesTheDocsName(t *testing.T) {
	doc, err := os.ReadFile("../walkthroughs.md")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, para := range strings.Split(string(doc), "\n\n") {
		if !strings.HasPrefix(para, "Stories: ") {
			continue
		}
		parts := strings.Split(para, "`")
		for i := 1; i < len(parts); i += 2 {
			named[parts[i]] = true
		}
	}
	have := map[string]bool{}
	for _, s := range stories() {
		have[s.name] = true
		if !named[s.name] {
			t.Errorf("story %s is named in no Stories: line of walkthroughs.md", s.name)
		}
	}
	for n := range named {
		if !have[n] {
			t.Errorf("walkthroughs.md names story %s, which stories() does not tell", n)
		}
	}
}
