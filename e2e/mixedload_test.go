package e2e

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// mixedLoad is a steady, bounded load of unary and streamed chat requests: prompt after
// prompt at a fixed pace, each prompt sent by several clients spread over the instances
// within a few milliseconds, so that its requests share a flight across instances.
type mixedLoad struct {
	model string
	reqs  []*loadReq
	sent  []chan struct{} // sent[k] is closed once prompt k's requests are on their way
	wg    sync.WaitGroup
}

// loadReq is one client request of a mixedLoad and what it got.
type loadReq struct {
	prompt     int
	stream     bool
	in         *instance
	start, end time.Time
	firstByte  time.Time    // streams: when the first bytes of the answer came
	unary      answer       // if !stream
	streamed   streamResult // if stream
}

func (r *loadReq) took() time.Duration { return r.end.Sub(r.start) }

// header is the response's header, nil if none came.
func (r *loadReq) header() http.Header {
	if r.stream {
		return r.streamed.header
	}
	return r.unary.header
}

func (r *loadReq) String() string {
	kind := "unary"
	if r.stream {
		kind = "stream"
	}
	role, key := "", ""
	if h := r.header(); h != nil {
		role, key = h.Get("X-Dedupe-Role"), h.Get("X-Dedupe-Key")
	}
	if len(key) > 12 {
		key = key[:12]
	}
	return fmt.Sprintf("%s p%02d on %s (sent %s, %s, key %s)", kind, r.prompt, r.in.name, r.start.Format("15:04:05.000"), role, key)
}

// loadShape is how many prompts of each kind, clients per prompt, and the pace.
type loadShape struct {
	unaryPrompts, streamPrompts int
	perPrompt                   int           // clients per prompt
	every                       time.Duration // between two prompts
	spread                      time.Duration // between two clients of one prompt
}

// promptText is the user message of prompt k: the fake's call log maps calls to prompts.
func promptText(k int, stream bool) string {
	if stream {
		return fmt.Sprintf("p%02d stream", k)
	}
	return fmt.Sprintf("p%02d unary", k)
}

// startMixedLoad sends the load in the background: prompt k starts at k × every; every
// third prompt is streamed while streamed prompts remain, its clients go round the
// instances starting at the k-th.
func startMixedLoad(ins []*instance, model string, s loadShape) *mixedLoad {
	l := &mixedLoad{model: model}
	n := s.unaryPrompts + s.streamPrompts
	streams := s.streamPrompts
	for k := range n {
		stream := streams > 0 && (k%3 == 2 || n-k <= streams)
		if stream {
			streams--
		}
		for j := range s.perPrompt {
			l.reqs = append(l.reqs, &loadReq{prompt: k, stream: stream, in: ins[(k+j)%len(ins)]})
		}
		l.sent = append(l.sent, make(chan struct{}))
	}
	start := time.Now()
	l.wg.Go(func() {
		for i, r := range l.reqs {
			k := r.prompt
			at := start.Add(time.Duration(k)*s.every + time.Duration(i%s.perPrompt)*s.spread)
			time.Sleep(time.Until(at)) // the load's pace, not a wait for an event
			l.wg.Go(func() { l.send(r) })
			if i+1 == len(l.reqs) || l.reqs[i+1].prompt != k {
				close(l.sent[k])
			}
		}
	})
	return l
}

func (l *mixedLoad) send(r *loadReq) {
	r.start = time.Now()
	if r.stream {
		s := openSSE(r.in.URL, streamBody(l.model, promptText(r.prompt, true)), apiKeyA)
		r.firstByte = firstBytes(s)
		r.streamed = s.result()
	} else {
		r.unary = post(r.in.URL, chatPath, chatBody(l.model, promptText(r.prompt, false)), apiKeyA)
	}
	r.end = time.Now()
}

// firstBytes waits until s has received bytes or ended, and returns when.
func firstBytes(s *sseClient) time.Time {
	for {
		s.mu.Lock()
		got, ch, ended := s.got != "", s.changed, isClosed(s.finished)
		s.mu.Unlock()
		if got || ended {
			return time.Now()
		}
		<-ch
	}
}

// wait waits for every answer (each client gives up after clientTimeout).
func (l *mixedLoad) wait() { l.wg.Wait() }

// stallFigures are the max and the 99th percentile of what clients of one kind waited
// beyond their upstream time.
type stallFigures struct {
	n        int
	max, p99 time.Duration
	worst    *loadReq
}

func stalls(reqs []*loadReq, upstream time.Duration) stallFigures {
	var f stallFigures
	var ds []time.Duration
	for _, r := range reqs {
		d := r.took() - upstream
		ds = append(ds, d)
		if f.worst == nil || d > f.max {
			f.max, f.worst = d, r
		}
	}
	if len(ds) == 0 {
		return f
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	f.n, f.p99 = len(ds), ds[(len(ds)*99+99)/100-1]
	return f
}
