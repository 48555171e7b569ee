package fakeupstream

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestWaitAnswersWhenCountersMove(t *testing.T) {
	u := New()
	srv := httptest.NewServer(u)
	defer srv.Close()
	u.Set(Behavior{Hold: true})

	got := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/_fake/wait?calls=1&completed=1&timeout=10s")
		if err != nil {
			t.Error(err)
		}
		got <- resp
	}()
	answered := make(chan struct{})
	go func() {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err == nil {
			resp.Body.Close()
		}
		close(answered)
	}()
	<-u.Started()
	select {
	case <-got:
		t.Fatal("wait answered before the call completed")
	case <-time.After(50 * time.Millisecond):
	}
	u.Release()
	<-answered
	resp := <-got
	defer resp.Body.Close()
	var s Stats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != 200 || s != (Stats{Calls: 1, Completed: 1}) {
		t.Fatalf("wait: %d %+v %v; want 200 and 1 call, completed", resp.StatusCode, s, err)
	}
}

func TestWaitTimesOut(t *testing.T) {
	srv := httptest.NewServer(New())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/_fake/wait?abandoned=1&timeout=20ms")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("wait for what never happens: %d; want 408", resp.StatusCode)
	}
}

func TestCallsLog(t *testing.T) {
	u := New()
	srv := httptest.NewServer(u)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/embeddings", strings.NewReader(`{"model":"m"}`))
	req.Header.Set("Authorization", "Bearer sk-x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Get(srv.URL + "/_fake/calls")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var calls []Call
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		t.Fatal(err)
	}
	want := Call{N: 1, Path: "/v1/embeddings", Authorization: "Bearer sk-x", Body: `{"model":"m"}`, Proto: "HTTP/1.1"}
	if len(calls) != 1 || calls[0] != want {
		t.Fatalf("calls %+v; want [%+v]", calls, want)
	}
}
