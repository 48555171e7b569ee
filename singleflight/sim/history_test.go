package sim

import (
	"fmt"
	"path"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// The history of a run: every event with its virtual time, the instance it happened on, and
// the file:function of the project's code that made it. The invariants (check_test.go) read
// it, and a story's timeline is its text.

// kind sorts events for the timeline's filters.
type kind uint8

const (
	kClient kind = iota + 1 // a client asked, was answered, left
	kCall                   // the upstream saw a call start or end
	kFlight                 // the Group reported an event (Observer)
	kRedis                  // a command an instance sent, and what Redis answered
	kFault                  // the schedule injected a fault or healed one
)

type event struct {
	at    time.Duration
	inst  string
	kind  kind
	what  string
	where string
}

type history struct {
	start    time.Time
	progress *atomic.Int64

	mu     sync.Mutex
	events []event
}

func (h *history) add(inst string, k kind, where, format string, args ...any) {
	h.mu.Lock()
	e := event{at: time.Since(h.start), inst: inst, kind: k, what: fmt.Sprintf(format, args...), where: where}
	h.events = append(h.events, e)
	h.mu.Unlock()
	h.progress.Add(1)
}

// reset forgets every event and counts time from start.
func (h *history) reset(start time.Time) {
	h.mu.Lock()
	h.start, h.events = start, nil
	h.mu.Unlock()
}

func (h *history) all() []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]event(nil), h.events...)
}

// timeline writes the events of the kinds given, one a line, in time order. Events at one
// instant of the resolution given (a time is rounded to it) are sorted by instance, rank
// and text: goroutines that run at one instant run in any order, and a timeline must not
// depend on it. A story uses a millisecond: a Redis round trip's order within one is the
// rank's, not the run's; and the same event twice in one is written once.
func timeline(events []event, res time.Duration, kinds ...kind) string {
	var sel []event
	for _, e := range events {
		for _, k := range kinds {
			if e.kind == k {
				e.at = e.at.Round(res)
				sel = append(sel, e)
				break
			}
		}
	}
	sort.SliceStable(sel, func(i, j int) bool {
		a, b := sel[i], sel[j]
		if a.at != b.at {
			return a.at < b.at
		}
		if a.inst != b.inst {
			return a.inst < b.inst
		}
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra < rb
		}
		return a.what < b.what
	})
	digits := 4
	if res >= time.Millisecond {
		digits = 3
	}
	var b strings.Builder
	for i, e := range sel {
		if res > 0 && i > 0 && e == sel[i-1] {
			continue // one event twice at one instant: how many ran there is the scheduler's
		}
		where := e.where
		if where == "" {
			where = "-"
		}
		fmt.Fprintf(&b, "%9s  %-5s %-58s %s\n", fmt.Sprintf("%.*fs", digits, e.at.Seconds()), e.inst, e.what, where)
	}
	return b.String()
}

// rank orders the events of one instant on one instance as they usually follow from one
// another: a fault, a client asking, a follower's reason to look, Redis's answers, the
// Group's events, the upstream, a client answered.
func rank(e event) int {
	switch {
	case e.kind == kFault:
		return 0
	case e.kind == kClient && strings.Contains(e.what, " asks "):
		return 1
	case e.kind == kFlight && strings.Contains(e.what, ": looks: "):
		return 2 // a look's reason, before the lookup it sends
	case e.kind == kRedis:
		return 3
	case e.kind == kFlight:
		return 4
	case e.kind == kCall:
		return 5
	}
	return 6
}

func fmtAt(d time.Duration) string {
	return fmt.Sprintf("%.4fs", d.Seconds())
}

// caller names the first frame of the singleflight package below the observer and the
// pipeline helper, as "file.go:Type.method": where the project's code made an event.
func caller() string {
	var pcs [32]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if i := strings.Index(f.Function, "/singleflight."); i >= 0 && !strings.HasSuffix(f.Function, ".observe") && !strings.Contains(f.Function, ".runPipelined") {
			return path.Base(f.File) + ":" + shortFunc(f.Function[i+len("/singleflight."):])
		}
		if i := strings.Index(f.Function, "/singleflight/internal/"); i >= 0 {
			fn := f.Function[i+len("/singleflight/internal/"):]
			return path.Base(f.File) + ":" + shortFunc(fn[strings.Index(fn, ".")+1:])
		}
		if !more {
			return "-"
		}
	}
}

// shortFunc turns "(*leader).followed.func1" into "leader.followed".
func shortFunc(s string) string {
	s = strings.NewReplacer("(*", "", ")", "").Replace(s)
	if i := strings.Index(s, ".func"); i >= 0 {
		s = s[:i]
	}
	return s
}

// observer records a Group's events.
type observer struct {
	h    *history
	inst *instance
}

func (o observer) Observe(e singleflight.Event) {
	if o.inst.dead.Load() {
		return // a process that was killed does nothing any more
	}
	what := describe(e)
	if what == "" {
		return
	}
	o.h.add(o.inst.id, kFlight, caller(), "%s", what)
}

// describe is an event as a timeline shows it; "" leaves it out.
func describe(e singleflight.Event) string {
	k := e.Key
	switch e.Kind {
	case singleflight.EventRole:
		return fmt.Sprintf("%s: role %s", k, e.Role)
	case singleflight.EventTakeover:
		return fmt.Sprintf("%s: takeover (%s)", k, e.Reason)
	case singleflight.EventLeaseLost:
		return fmt.Sprintf("%s: lease lost, call cancelled", k)
	case singleflight.EventFencedWrite:
		return fmt.Sprintf("%s: %s fenced", k, e.Op)
	case singleflight.EventHeartbeatFailed:
		return fmt.Sprintf("%s: renewal failed: %s", k, errWord(e.Err))
	case singleflight.EventDegraded:
		return "degraded: local-only"
	case singleflight.EventRecovered:
		return "recovered: distributed again"
	case singleflight.EventShardDown:
		return fmt.Sprintf("shard %q down: %s", e.Op, errWord(e.Err))
	case singleflight.EventShardUp:
		return fmt.Sprintf("shard %q up", e.Op)
	case singleflight.EventAbandoned:
		return fmt.Sprintf("%s: nobody waited, spell ended (%s)", k, e.Reason)
	case singleflight.EventWait:
		return fmt.Sprintf("%s: wait for the owner ended: %s", k, e.Reason)
	case singleflight.EventLook:
		return fmt.Sprintf("%s: looks: %s", k, e.Reason)
	}
	return ""
}

// errWord is an error as a timeline shows it: the kind, without addresses.
func errWord(err error) string {
	switch {
	case err == nil:
		return "-"
	case strings.Contains(err.Error(), "i/o timeout"), strings.Contains(err.Error(), "deadline"):
		return "timeout"
	case strings.Contains(err.Error(), "refused"):
		return "refused"
	case strings.Contains(err.Error(), "reset"), strings.Contains(err.Error(), "EOF"), strings.Contains(err.Error(), "closed"):
		return "connection lost"
	}
	s := err.Error()
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}
