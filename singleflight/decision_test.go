package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestLookupAndClaimRepliesDecodeIntoDecisions(t *testing.T) {
	g := backend{name: "redis", redis: redistest.Start(t)}.group(t, Options{})
	r := g.rem()
	ctx := context.Background()
	key := uniqueKey()

	mine := r.newToken(ctx)
	own, err := r.lookup(key, false, mine, CallOptions{}, "1", 1)
	if err != nil || own.verdict != verdictOwner || own.token != mine || own.attempt != 1 || own.gen == "" || own.until == 0 || own.clock.us == 0 {
		t.Fatalf("lookup of a free key with a candidate = %+v, %v; want verdictOwner with the candidate, attempt 1, a gen, a lease and a clock", own, err)
	}
	fol, err := r.lookup(key, false, "", CallOptions{}, "1", 1)
	if err != nil || fol.verdict != verdictFollow || fol.token != mine || fol.gen != own.gen || fol.remaining <= 0 || fol.batches != 0 || fol.clock.us < own.clock.us {
		t.Fatalf("lookup of a running flight = %+v, %v; want verdictFollow of %s from gen %s, 0 batches", fol, err, mine, own.gen)
	}

	// A claim of a flight whose lease runs follows its owner; one that saw another owner is
	// told the meta moved on; the owner's own token is the owner again.
	c, err := r.claim(ctx, key, r.newToken(ctx), decision{token: mine, seen: seenExpired}, false, CallOptions{}, "1", 1)
	if err != nil || c.verdict != verdictFollow || c.token != mine || c.batches != -1 || c.remaining <= 0 {
		t.Errorf("claim while the lease runs = %+v, %v; want verdictFollow of %s, batches unknown", c, err, mine)
	}
	c, err = r.claim(ctx, key, mine, decision{seen: seenAbsent}, false, CallOptions{}, "1", 1)
	if err != nil || c.verdict != verdictOwner || c.token != mine || c.attempt != 1 {
		t.Errorf("claim again with the owner's token = %+v, %v; want verdictOwner, attempt 1", c, err)
	}
	if err := r.rdb.HSet(ctx, r.keys(key).meta, "lease_until", 1).Err(); err != nil {
		t.Fatal(err)
	}
	exp, err := r.lookup(key, false, "", CallOptions{}, "1", 1)
	if err != nil || exp.verdict != verdictClaim || exp.seen != seenExpired || exp.token != mine || exp.attempt != 1 {
		t.Fatalf("lookup of a flight whose lease ran out = %+v, %v; want verdictClaim, seenExpired, of %s", exp, err, mine)
	}
	c, err = r.claim(ctx, key, r.newToken(ctx), decision{token: "1-other-1", seen: seenExpired}, false, CallOptions{}, "1", 1)
	if err != nil || c.verdict != verdictChanged {
		t.Errorf("claim that saw another token = %+v, %v; want verdictChanged", c, err)
	}
	next := r.newToken(ctx)
	c, err = r.claim(ctx, key, next, exp, false, CallOptions{}, "1", 1)
	if err != nil || c.verdict != verdictOwner || c.token != next || c.attempt != 2 {
		t.Errorf("takeover claim = %+v, %v; want verdictOwner with the new token, attempt 2", c, err)
	}
}

func TestUnexpectedRepliesAreErrors(t *testing.T) {
	for _, v := range [][]any{{}, {"what"}, {int64(1)}} {
		if d, err := decodeLookup(v, "", time.Now()); err == nil {
			t.Errorf("decodeLookup(%v) = %+v, nil; want an error", v, d)
		}
		if d, err := decodeClaim(v, "", time.Now()); err == nil {
			t.Errorf("decodeClaim(%v) = %+v, nil; want an error", v, d)
		}
	}
}

func TestTakeoverReasonsAreTheEventsReasons(t *testing.T) {
	for s, want := range map[seen]string{seenExpired: "expired", seenFailed: "failed", seenAbsent: "", seenDone: ""} {
		if got := takeoverOf(s).String(); got != want {
			t.Errorf("takeoverOf(%d) = %q; want %q", s, got, want)
		}
	}
}
