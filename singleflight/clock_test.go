package singleflight

import (
	"testing"
	"time"
)

// The follower's clock alone: next from what was observed and what the hub heard.
func TestClockNext(t *testing.T) {
	const lease = time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(5 * lease) // a follow five leases old
	look := now.Add(-400 * time.Millisecond)
	// seen: a clock whose last look, 400 ms ago, found the attempt running with 500 ms
	// left, its owner seen at work: alive messages heard since are trusted 4.6 s on.
	seen := func() followClock {
		c := newClock(t0, lease, 0, 0, lease, "1-A-1")
		c.entries(t0.Add(lease / 2))
		c.looked(look)
		c.found(look, 500*time.Millisecond)
		return c
	}
	own, trusted := now.Add(100*time.Millisecond), now.Add(4200*time.Millisecond)
	heard := aliveView{listening: true, until: now.Add(900 * time.Millisecond), moving: true} // a message 100 ms ago
	for _, tc := range []struct {
		name  string
		clock func() followClock
		alive aliveView
		at    time.Time
		why   lookReason
	}{
		{"nothing heard: the lease known", seen, aliveView{listening: true}, own, lookLease},
		{"alive: on the silence, or at the trust's end", seen, heard, trusted, lookAlive},
		{"not watching the owner's channel", seen, aliveView{until: heard.until, moving: true}, own, lookLease},
		{"owner never seen at work (ADR 0059)", func() followClock {
			c := newClock(t0, lease, 0, 0, 5*lease+100*time.Millisecond, "1-A-1")
			c.looked(look)
			c.found(look, 500*time.Millisecond) // no further than the lease it knew: not renewed
			return c
		}, heard, own, lookLease},
		{"vouched for less than the lease known", func() followClock {
			c := seen()
			c.found(look, 2*lease)
			return c
		}, heard, look.Add(2 * lease), lookLease},
		{"heard at the look itself", seen, aliveView{listening: true, until: look.Add(lease), moving: true}, own, lookLease},
		{"a message that ends with the trust", func() followClock {
			c := seen()
			c.trusted = heard.until
			return c
		}, heard, heard.until, lookTrust},
		{"heard before the look only", seen, aliveView{listening: true, until: look.Add(-time.Millisecond).Add(lease), moving: true}, own, lookLease},
		{"silent for a lease", seen, aliveView{listening: true, until: now, moving: true}, own, lookLease},
		{"a message that outlasts the trust", func() followClock {
			c := seen()
			c.trusted = now.Add(lease / 2)
			return c
		}, heard, now.Add(lease / 2), lookTrust},
		{"said gone", func() followClock {
			c := seen()
			c.gone(now)
			return c
		}, heard, now, lookGone},
		{"the token unrenewed: the message's until does not move", seen, aliveView{listening: true, until: heard.until}, heard.until, lookVouched},
		{"the flight's channel unconfirmed for two leases (ADR 0055)", seen, aliveView{listening: true, until: heard.until, moving: true, unconfirmed: now.Add(-2 * lease)}, own, lookLease},
		{"the channel unconfirmed since just after the look", seen, aliveView{listening: true, until: now.Add(2 * lease), moving: true, unconfirmed: look.Add(time.Nanosecond)}, look.Add(time.Nanosecond).Add(lease), lookVouched},
		{"a Cluster whose shard is down (ADR 0023)", seen, aliveView{listening: true, until: heard.until, moving: true, blindShard: true}, own, lookLease},
		{"pub/sub down: read instead", seen, aliveView{listening: true, until: heard.until, moving: true, pubsubDown: true}, now.Add(pubsubDownRead), readPubsub},
		{"pub/sub down, the look sooner than a read", func() followClock {
			c := seen()
			c.rereading(now)
			return c
		}, aliveView{pubsubDown: true}, now.Add(reread), lookReread},
		{"recheck (tests)", func() followClock {
			c := seen()
			c.recheck = 50 * time.Millisecond
			return c
		}, heard, now.Add(50 * time.Millisecond), lookRecheck},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.clock()
			at, why := c.next(now, tc.alive)
			if !at.Equal(tc.at) || why != tc.why {
				t.Fatalf("next = %v (%v); want %v (%v)", at.Sub(now), why, tc.at.Sub(now), tc.why)
			}
		})
	}
}

// What each observation does to the clock.
func TestClockObservations(t *testing.T) {
	const lease = time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t.Run("the trust grows with the follow, one to ten leases (ADR 0082)", func(t *testing.T) {
		c := newClock(t0, lease, 0, 0, lease, "1-A-1")
		for _, tc := range []struct{ age, want time.Duration }{
			{0, lease}, {lease / 2, lease}, {3 * lease, 3 * lease}, {10 * lease, 10 * lease}, {time.Hour, 10 * lease},
		} {
			c.looked(t0.Add(tc.age))
			if got := c.trusted.Sub(t0.Add(tc.age)); got != tc.want {
				t.Errorf("at age %v, trusted for %v; want %v", tc.age, got, tc.want)
			}
		}
	})
	t.Run("a new owner is trusted anew, once seen at work", func(t *testing.T) {
		c := newClock(t0, lease, 0, 0, lease, "1-A-1")
		c.entries(t0.Add(lease / 2))
		c.gone(t0.Add(lease))
		c.switched(t0.Add(4*lease), lease, "2-B-1")
		if c.renewed || c.saidGone() || !c.trusted.Equal(t0.Add(8*lease)) || c.why != lookLease {
			t.Fatalf("after a switch: renewed %v, said gone %v, trusted %v, why %v; want false, false, %v, lease",
				c.renewed, c.saidGone(), c.trusted.Sub(t0), c.why, 8*lease)
		}
		c.owner(t0.Add(5*lease), "2-B-1") // the same owner: nothing changes
		if !c.trusted.Equal(t0.Add(8 * lease)) {
			t.Fatalf("trusted moved to %v by the same owner", c.trusted.Sub(t0))
		}
	})
	t.Run("a look shows the owner at work only by a lease that moved", func(t *testing.T) {
		c := newClock(t0, lease, 0, 0, lease, "1-A-1")
		c.found(t0.Add(lease/2), lease/2) // the same lease's end
		if c.renewed {
			t.Fatal("renewed by a look that found the lease where it was")
		}
		c.found(t0.Add(lease/2), lease)
		if !c.renewed || !c.leaseEnd.Equal(t0.Add(3*lease/2)) {
			t.Fatalf("renewed %v, lease end %v; want true, %v", c.renewed, c.leaseEnd.Sub(t0), 3*lease/2)
		}
	})
	t.Run("a look after the token was said gone trusts nothing", func(t *testing.T) {
		c := newClock(t0, lease, 0, 0, lease, "1-A-1")
		c.gone(t0.Add(lease / 4))
		c.looked(t0.Add(lease / 2))
		if !c.saidGone() {
			t.Fatal("a look trusted the alive messages of a token said gone")
		}
	})
	t.Run("said gone: the lease is over the first time only", func(t *testing.T) {
		c := newClock(t0, lease, 0, 0, lease, "1-A-1")
		c.gone(t0.Add(lease / 4))
		c.found(t0.Add(lease/2), lease)
		c.gone(t0.Add(lease))
		if !c.leaseEnd.Equal(t0.Add(3*lease/2)) || !c.own.Equal(t0.Add(lease)) || !c.saidGone() {
			t.Fatalf("lease end %v, look at %v, said gone %v; want %v, %v, true", c.leaseEnd.Sub(t0), c.own.Sub(t0), c.saidGone(), 3*lease/2, lease)
		}
	})
	t.Run("a blind look asks again within the lease known", func(t *testing.T) {
		c := newClock(t0, lease, 0, 0, 100*time.Millisecond, "1-A-1")
		c.blind(t0, false)
		if !c.own.Equal(t0.Add(100*time.Millisecond)) || c.why != lookBlind || c.outage {
			t.Fatalf("look at %v (%v), outage %v; want the lease's end, blind, no outage", c.own.Sub(t0), c.why, c.outage)
		}
		c.blind(t0, true)
		if !c.own.Equal(t0.Add(blindRetry)) || !c.outage {
			t.Fatalf("outlasting: look at %v, outage %v; want %v, true", c.own.Sub(t0), c.outage, blindRetry)
		}
		c.answered(t0.Add(lease))
		if c.outage || !c.lateUntil.Equal(t0.Add(2*lease)) {
			t.Fatalf("first answer after the outage: outage %v, late until %v; want false, %v", c.outage, c.lateUntil.Sub(t0), 2*lease)
		}
	})
	t.Run("a lease found run out is waited a grace from the first such look (ADR 0086)", func(t *testing.T) {
		const grace = lease / 2
		c := newClock(t0, lease, grace, 0, lease, "1-A-1")
		c.ranOut(t0.Add(lease))
		c.late()
		if !c.lateUntil.Equal(t0.Add(lease+grace)) || !c.own.Equal(c.lateUntil) || c.why != lookLate {
			t.Fatalf("first look found it run out: late until %v, look at %v (%v); want %v, then, late", c.lateUntil.Sub(t0), c.own.Sub(t0), c.why, lease+grace)
		}
		c.ranOut(t0.Add(lease + grace)) // the same lapse: no more wait
		if !c.lateUntil.Equal(t0.Add(lease + grace)) {
			t.Fatalf("a second look at the same lapse moved the wait to %v", c.lateUntil.Sub(t0))
		}
		for name, atWork := range map[string]func(c *followClock, now time.Time){
			"entries":                 func(c *followClock, now time.Time) { c.entries(now) },
			"a look found it running": func(c *followClock, now time.Time) { c.found(now, lease) },
		} {
			c := newClock(t0, lease, grace, 0, lease, "1-A-1")
			c.ranOut(t0.Add(lease))
			atWork(&c, t0.Add(3*lease)) // the owner at work: a later lapse is waited anew
			c.ranOut(t0.Add(5 * lease))
			if !c.lateUntil.Equal(t0.Add(5*lease + grace)) {
				t.Fatalf("after %s, a new lapse: late until %v; want %v", name, c.lateUntil.Sub(t0), 5*lease+grace)
			}
		}
		c = newClock(t0, lease, grace, 0, lease, "1-A-1")
		c.ranOut(t0.Add(lease))
		c.owner(t0.Add(2*lease), "2-B-1") // another attempt: its own lapse is waited anew
		c.ranOut(t0.Add(3 * lease))
		if !c.lateUntil.Equal(t0.Add(3*lease + grace)) {
			t.Fatalf("a new attempt's lapse: late until %v; want %v", c.lateUntil.Sub(t0), 3*lease+grace)
		}
		c = newClock(t0, lease, grace, 0, lease, "1-A-1")
		c.outage = true
		c.answered(t0.Add(lease)) // an outage's end waits a lease from the answer
		c.ranOut(t0.Add(lease))
		if !c.lateUntil.Equal(t0.Add(2 * lease)) {
			t.Fatalf("a lapse found within the outage's wait moved it to %v; want %v", c.lateUntil.Sub(t0), 2*lease)
		}
	})
	t.Run("a blind look in a Cluster takes the alive messages' word back (ADR 0023)", func(t *testing.T) {
		for _, sharded := range []bool{false, true} {
			c := newClock(t0, lease, 0, 0, lease, "1-A-1")
			c.entries(t0.Add(9 * lease / 2))
			c.looked(t0.Add(9 * lease / 2))
			now := t0.Add(5 * lease)
			c.looking(now, aliveView{listening: true, until: now.Add(lease), moving: true})
			c.blindLook(sharded)
			want := now.Add(lease)
			if sharded {
				want = t0.Add(11 * lease / 2)
			}
			if !c.leaseEnd.Equal(want) {
				t.Errorf("sharded %v: lease end %v; want %v", sharded, c.leaseEnd.Sub(t0), want.Sub(t0))
			}
		}
	})
}
