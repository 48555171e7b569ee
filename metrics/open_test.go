package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCountOpenCountsUntilTheLastByte: a request is open while its handler runs, a stream
// until it returns; a probe is never counted.
func TestCountOpenCountsUntilTheLastByte(t *testing.T) {
	m, _ := newTest(t)
	entered, finish := make(chan struct{}), make(chan struct{})
	h := m.CountOpen("/healthz")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			// The stream is open; the probe itself is not counted.
			if got := testutil.ToFloat64(m.open); got != 1 {
				t.Errorf("open_requests %v during a probe beside one stream; want 1", got)
			}
			return
		}
		w.Write([]byte("data: first\n\n"))
		w.(http.Flusher).Flush()
		entered <- struct{}{}
		<-finish
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/v1/chat/completions")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-entered
	if got := testutil.ToFloat64(m.open); got != 1 {
		t.Errorf("open_requests %v while a stream runs; want 1", got)
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.open); got != 0 {
		t.Errorf("open_requests %v after the stream ended; want 0", got)
	}
}

func TestCountOpenOnNilMetricsPassesThrough(t *testing.T) {
	var m *Metrics
	var served bool
	h := m.CountOpen()(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/models", nil))
	if !served {
		t.Error("the request was not served")
	}
}
