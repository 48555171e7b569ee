package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

var benchSeq atomic.Int64

func benchPost(b *testing.B, url, body string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-bench")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkOwnerPath sends unique prompts (every request an owner), straight to the fake
// upstream as the baseline and through the proxy on each backend, in one run.
func BenchmarkOwnerPath(b *testing.B) {
	up := startUpstream(b)
	rs := redistest.Start(b)
	targets := []struct{ name, url string }{
		{"direct", up.URL},
		{"memory", newInstance(b, up, setup{flight: singleflight.Options{ResultTTL: time.Minute}}).URL},
		{"redis", newInstance(b, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}).URL},
	}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			for b.Loop() {
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"prompt %d"}]}`, benchSeq.Add(1))
				benchPost(b, tg.url+"/v1/chat/completions", body)
			}
		})
	}
	b.Run("redis-hit", func(b *testing.B) {
		body := `{"model":"m","temperature":0,"messages":[{"role":"user","content":"the same"}]}` // stored: it does not sample
		benchPost(b, targets[2].url+"/v1/chat/completions", body)
		for b.Loop() {
			benchPost(b, targets[2].url+"/v1/chat/completions", body)
		}
	})
}

// BenchmarkStreamFirstChunkLag measures, per streamed flight, the follower's first event
// time minus the owner's, with the follower on another instance; p50 and p99 are reported.
func BenchmarkStreamFirstChunkLag(b *testing.B) {
	rs := redistest.Start(b)
	up := startUpstream(b)
	s := setup{redis: rs}
	owner, follower := newInstance(b, up, s), newInstance(b, up, s)
	var lags []time.Duration
	for b.Loop() {
		up.Set(fakeBehavior{Delay: 20 * time.Millisecond, Chunks: 3})
		body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"s %d"}]}`, benchSeq.Add(1))
		started := up.Started()
		first := make(chan time.Time, 2)
		done := make(chan struct{}, 2)
		read := func(url string) {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				done <- struct{}{}
				return
			}
			buf := make([]byte, 4096)
			n, _ := resp.Body.Read(buf)
			if n > 0 {
				first <- time.Now()
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- struct{}{}
		}
		go read(owner.URL)
		<-started
		go read(follower.URL)
		t1, t2 := <-first, <-first
		<-done
		<-done
		lag := t2.Sub(t1)
		if lag < 0 {
			lag = -lag
		}
		lags = append(lags, lag)
	}
	slices.Sort(lags)
	b.ReportMetric(float64(lags[len(lags)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds()), "p99-µs")
}
