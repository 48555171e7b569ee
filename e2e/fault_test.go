package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// ownedFlight starts a held flight owned by the first instance: its owner's client plus
// onOwner more clients there, then followers clients spread over the other instances, and
// waits until all of them wait for the one upstream call.
func ownedFlight(t *testing.T, c *cluster, body string, onOwner, followers int) (owners, others []<-chan answer) {
	t.Helper()
	c.fake.set(fakeupstream.Behavior{Hold: true})
	owners = append(owners, postAsync(c.ins[0].URL, chatPath, body, apiKeyA))
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second) // the first instance owns it
	owners = append(owners, spread(c.ins[:1], onOwner, chatPath, body, apiKeyA)...)
	others = spread(c.ins[1:], followers, chatPath, body, apiKeyA)
	waitWaiting(t, c.ins, 1+onOwner+followers)
	return owners, others
}

// leaseLeft reads, from Redis, how long the lease of the cluster's one flight has to run:
// no follower may take over before that.
func leaseLeft(t *testing.T, c *cluster) time.Duration {
	t.Helper()
	ctx := context.Background()
	rdb := c.redis.Client()
	metas, err := rdb.Keys(ctx, "ai:flight:meta:*").Result()
	if err != nil || len(metas) != 1 {
		t.Fatalf("flights in Redis: %v %v; want one", metas, err)
	}
	until, err := rdb.HGet(ctx, metas[0], "lease_until").Int64()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(until-now.UnixMilli()) * time.Millisecond
}

// takeoverBounds are the limits of a takeover after the owner stopped renewing, measured
// from before left was read: not before the lease ran out, and no later than that plus the
// jitter and a margin for a busy 2-core machine.
func takeoverBounds(left time.Duration) (lo, hi time.Duration) {
	return left - 5*time.Millisecond, left + jitter + 700*time.Millisecond
}

// TestOwnerKilled: kill -9 of the owner mid-flight; followers on the other instances take
// over when its lease runs out and all get the second call's answer.
func TestOwnerKilled(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	model := "e2e-kill"
	owners, others := ownedFlight(t, c, chatBody(model, "kill the owner"), 4, 20)

	takeover := c.fake.timeTo(fakeupstream.Stats{Calls: 2}, 10*time.Second)
	left := leaseLeft(t, c)
	c.ins[0].killHard()
	c.fake.waitFor(fakeupstream.Stats{Calls: 1, Abandoned: 1}, 5*time.Second) // its call died with it
	took := takeover()
	c.fake.release()

	lo, hi := takeoverBounds(left)
	t.Logf("TAKEOVER kill=%dms lease=%dms lease_left_at_kill=%dms heartbeat=%dms jitter=%dms", ms(took), ms(leaseTTL), ms(left), ms(heartbeat), ms(jitter))
	within(t, "takeover after kill -9", took, lo, hi)
	for i, a := range collect(owners) {
		if a.err == nil {
			t.Errorf("client %d of the killed instance: %v; want a broken connection", i, a)
		}
	}
	for i, a := range collect(others) {
		wantChat(t, fmt.Sprintf("follower %d", i), a, model, 2)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Abandoned: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want 2 calls, the first abandoned", s)
	}
	if got := sum(c.ins[1:], "llm_dedupe_takeovers_total", map[string]string{"reason": "expired"}); got != 1 {
		t.Errorf("takeovers{reason=expired} %v; want 1", got)
	}
}

// TestOwnerPaused: the owner is stopped (SIGSTOP) for longer than its lease; another
// instance takes over. When the old owner continues, its renewal is refused: it cancels its
// upstream call (the fake sees it abandoned), counts the lost lease, and its clients follow
// the new owner, so every client gets the same answer.
func TestOwnerPaused(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	model := "e2e-pause"
	owners, others := ownedFlight(t, c, chatBody(model, "pause the owner"), 4, 20)
	old := c.ins[0]

	takeover := c.fake.timeTo(fakeupstream.Stats{Calls: 2}, 10*time.Second)
	stopped := time.Now()
	left := leaseLeft(t, c)
	old.pause()
	took := takeover()
	if d := leaseTTL + heartbeat - time.Since(stopped); d > 0 {
		time.Sleep(d) // the fault itself: stay stopped longer than the lease
	}
	old.resume()
	paused := time.Since(stopped)
	// Continued, the old owner learns it lost the lease and cancels its call.
	c.fake.waitFor(fakeupstream.Stats{Calls: 2, Abandoned: 1}, 5*time.Second)
	c.fake.release()

	lo, hi := takeoverBounds(left)
	t.Logf("TAKEOVER pause=%dms lease=%dms lease_left_at_pause=%dms stopped_for=%dms", ms(took), ms(leaseTTL), ms(left), ms(paused))
	within(t, "takeover from a stopped owner", took, lo, hi)
	all := collect(append(owners, others...))
	for i, a := range all {
		wantChat(t, fmt.Sprintf("client %d", i), a, model, 2)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Abandoned: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want 2 calls, the old owner's abandoned", s)
	}
	lost := old.metric("llm_dedupe_lease_lost_total", nil) + old.metric("llm_dedupe_fenced_writes_total", nil)
	if lost < 1 {
		t.Errorf("old owner: lease_lost_total + fenced_writes_total = %v; want at least 1", lost)
	}
	if got := sum(c.ins[1:], "llm_dedupe_takeovers_total", map[string]string{"reason": "expired"}); got != 1 {
		t.Errorf("takeovers{reason=expired} %v; want 1", got)
	}
}

// TestRollingRestart: SIGTERM to the owner with a short shutdown_timeout. It drains, lets
// its flight run for shutdown_timeout, then releases it as failed ("shutdown"), so a
// follower elsewhere takes over at once instead of waiting for the lease. A new process
// in its place serves the stored answer.
func TestRollingRestart(t *testing.T) {
	const grace = 300 * time.Millisecond
	c := startCluster(t, clusterOpts{env: map[string]string{"LLM_DEDUPE_SHUTDOWN_TIMEOUT": grace.String()}})
	model := "e2e-rolling"
	body := chatBody(model, "restart the owner")
	owners, others := ownedFlight(t, c, body, 2, 20)
	old := c.ins[0]

	takeover := c.fake.timeTo(fakeupstream.Stats{Calls: 2}, 10*time.Second)
	old.signal(syscall.SIGTERM)
	took := takeover()
	c.fake.waitFor(fakeupstream.Stats{Calls: 2, Abandoned: 1}, 5*time.Second)
	c.fake.release()

	t.Logf("TAKEOVER shutdown=%dms lease=%dms shutdown_timeout=%dms after_release=%dms", ms(took), ms(leaseTTL), ms(grace), ms(took-grace))
	// Not before shutdown_timeout. That it came from the release, not from the lease
	// running out, is what takeovers{reason=shutdown} below says: no upper bound in time,
	// which a loaded machine would break across processes.
	if took < grace {
		t.Errorf("takeover after SIGTERM took %v; want at least shutdown_timeout, %v", took.Round(time.Millisecond), grace)
	}
	if code := old.wait(10 * time.Second); code != 0 {
		t.Errorf("old owner exited with status %d; want 0", code)
	}
	outcomes := map[string]int{}
	for i, a := range collect(owners) {
		// Its clients waited for its own call: told to retry, or cut off as it closed.
		if a.err != nil {
			outcomes["closed"]++
			continue
		}
		outcomes[fmt.Sprintf("%d %s", a.status, errorCode(a.body))]++
		if a.status != 503 || errorCode(a.body) != "shutting_down" {
			t.Errorf("client %d of the stopped instance: %v; want 503 shutting_down or a closed connection", i, a)
		}
	}
	t.Logf("clients of the stopped instance: %v", outcomes)
	for i, a := range collect(others) {
		wantChat(t, fmt.Sprintf("follower %d", i), a, model, 2)
	}
	if got := sum(c.ins[1:], "llm_dedupe_takeovers_total", map[string]string{"reason": "shutdown"}); got != 1 {
		t.Errorf("takeovers{reason=shutdown} %v; want 1", got)
	}

	// The rolling restart goes on: a new process takes the old one's place.
	fresh := c.start()
	a := post(fresh.URL, chatPath, body, apiKeyA)
	wantChat(t, "restarted instance", a, model, 2)
	if a.role() != "hit" {
		t.Errorf("restarted instance: role %q; want hit", a.role())
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Abandoned: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want 2 calls, the first abandoned", s)
	}
}

// TestUpstream500ThenSuccess: the owner's upstream call answers 500; its own client gets
// that answer, and a follower on another instance takes over at once and succeeds.
func TestUpstream500ThenSuccess(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	model := "e2e-500"
	c.fake.set(fakeupstream.Behavior{Hold: true, Fail: []int{500}})
	owner := postAsync(c.ins[0].URL, chatPath, chatBody(model, "fail once"), apiKeyA)
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	others := spread(c.ins[1:], 20, chatPath, chatBody(model, "fail once"), apiKeyA)
	waitWaiting(t, c.ins, 21)
	c.fake.release()

	if a := <-owner; a.status != 500 || a.role() != "owner" || errorCode(a.body) != "fake_500" {
		t.Errorf("owner's client: %v; want its own upstream 500", a)
	}
	for i, a := range collect(others) {
		wantChat(t, fmt.Sprintf("follower %d", i), a, model, 2)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Completed: 2}) {
		t.Errorf("upstream %+v; want 2 calls, both answered", s)
	}
	if got := sum(c.ins[1:], "llm_dedupe_takeovers_total", map[string]string{"reason": "failed"}); got != 1 {
		t.Errorf("followers' takeovers{reason=failed} %v; want 1", got)
	}
	if got := c.ins[0].metric("llm_dedupe_upstream_requests_total", map[string]string{"code": "500"}); got != 1 {
		t.Errorf("owner: upstream_requests_total{code=500} %v; want 1", got)
	}
}

// TestUpstreamHang: the upstream never answers; the hard timeout ends each attempt, the
// flight gives up after max_attempts, and every client gets a 504 in the OpenAI error
// shape, never a hang.
func TestUpstreamHang(t *testing.T) {
	const timeout, attempts = time.Second, 2
	c := startCluster(t, clusterOpts{env: map[string]string{
		"LLM_DEDUPE_UPSTREAM_TIMEOUT":      timeout.String(),
		"LLM_DEDUPE_FLIGHT_MAX_ATTEMPTS":   fmt.Sprint(attempts),
		"LLM_DEDUPE_UPSTREAM_IDLE_TIMEOUT": "10s",
	}})
	c.fake.set(fakeupstream.Behavior{Hold: true}) // and never released
	body := chatBody("e2e-hang", "never answered")
	start := time.Now()
	chs := spread(c.ins, 12, chatPath, body, apiKeyA)
	as := collect(chs)
	took := time.Since(start)
	t.Logf("HANG upstream_timeout=%dms max_attempts=%d all_answered=%dms", ms(timeout), attempts, ms(took))
	for i, a := range as {
		// The last attempt's answer, or a 504 of the flight's own: never a 502, which
		// says the upstream failed rather than ran out of time (README, "Limits, and what the
		// proxy refuses").
		if a.err != nil || a.status != 504 {
			t.Errorf("client %d: %v; want a 504", i, a)
			continue
		}
		var e struct {
			Error struct {
				Type, Code, Message string
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(a.body), &e); err != nil || e.Error.Type != "upstream_error" || e.Error.Code != "upstream_timeout" || e.Error.Message == "" {
			t.Errorf("client %d: body %q; want an OpenAI-style error object with code upstream_timeout", i, a.body)
		}
	}
	if took > attempts*timeout+5*time.Second {
		t.Errorf("the clients were answered after %v; want about %d × %v", took, attempts, timeout)
	}
	// Each attempt's call was cut off by the timeout.
	s := c.fake.waitFor(fakeupstream.Stats{Calls: attempts, Abandoned: attempts}, 5*time.Second)
	if s != (fakeupstream.Stats{Calls: attempts, Abandoned: attempts}) {
		t.Errorf("upstream %+v; want %d calls, all abandoned", s, attempts)
	}
}

// errorCode is the code of an OpenAI-style error body, or "".
func errorCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}
