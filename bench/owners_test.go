package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// TestMain lets the test binary be the owner process too, as the bench binary is.
func TestMain(m *testing.M) {
	runAsOwners()
	os.Exit(m.Run())
}

// TestOwnerProcess runs the owner process on a real redis-server and follows one of its
// flights from this process, as the measured proxy does.
func TestOwnerProcess(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found on PATH: install it (Debian: apt-get install redis-server; or run `make test`, which does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := &env{dir: t.TempDir(), c: newClient(), runID: "owners-test"}
	t.Cleanup(e.ps.stopAll)
	_, addr, err := startRedis(ctx, &e.ps, e.dir)
	if err != nil {
		t.Fatal(err)
	}
	e.rdb = redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { e.rdb.Close() })

	bodies := [][]byte{chatBody("owners test 0", false), chatBody("owners test 1", false), chatBody("owners test 2", false)}
	o, err := e.startOwners(ctx, bodies)
	if err != nil {
		t.Fatal(err)
	}

	h, err := benchHasher()
	if err != nil {
		t.Fatal(err)
	}
	req, err := h.Key(http.MethodPost, "/v1/chat/completions", http.Header{"Authorization": {e.c.auth}}, bodies[1])
	if err != nil {
		t.Fatal(err)
	}
	roles := make(chan singleflight.Role, 4)
	g := singleflight.New(singleflight.Options{Redis: e.rdb, Observer: roleObserver(roles)})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	r, err := g.Do(req.Key, false, func(ctx context.Context, w *singleflight.Writer) (singleflight.Result, error) {
		t.Error("the follower ran the call; want it owned by the owner process")
		return singleflight.Result{Head: singleflight.Head{Status: 500}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Release only once this process follows the flight, or it would find the answer stored.
	select {
	case role := <-roles:
		if role != singleflight.RoleFollower {
			t.Fatalf("role = %v; want follower", role)
		}
	case <-ctx.Done():
		t.Fatal("no role decided")
	}
	if err := o.release(); err != nil {
		t.Fatal(err)
	}
	var body []byte
	for {
		b, err := r.Next(ctx)
		body = append(body, b...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if got, want := string(body), string(heldAnswer(1)); got != want {
		t.Errorf("followed answer = %s; want %s", got, want)
	}
	if r.Role() != singleflight.RoleFollower {
		t.Errorf("role = %v; want follower", r.Role())
	}
	// It exits once it has reported; its report must still be read after it is gone.
	select {
	case <-o.p.done:
	case <-ctx.Done():
		t.Fatal("the owner process did not exit after the release")
	}
	rep, err := o.done(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DoneSeconds <= 0 || rep.DoneSeconds > 30 {
		t.Errorf("owners done after %v s; want a positive time under 30 s", rep.DoneSeconds)
	}
	if len(rep.EndSeconds) != len(bodies) {
		t.Fatalf("%d flight ends; want %d", len(rep.EndSeconds), len(bodies))
	}
	for i, end := range rep.EndSeconds {
		if end <= 0 || end > rep.DoneSeconds {
			t.Errorf("flight %d ended %v s after the release; want in (0, %v]", i, end, rep.DoneSeconds)
		}
	}
	if rep.LeasesLost != 0 {
		t.Errorf("%d leases lost; want 0", rep.LeasesLost)
	}
	o.close(&e.ps)
	select {
	case <-o.p.done:
	default:
		t.Fatal("the owner process is still running after close")
	}
	if code := o.p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("owner process exit code = %d; want 0:\n%s", code, strings.TrimSpace(o.p.tail()))
	}
}

// roleObserver sends every decided role to its channel, dropping what does not fit.
type roleObserver chan singleflight.Role

func (c roleObserver) Observe(ev singleflight.Event) {
	if ev.Kind == singleflight.EventRole {
		select {
		case c <- ev.Role:
		default:
		}
	}
}
