package fakeupstream

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
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

// TestEmbeddingsInBase64: an embeddings request with encoding_format base64, which the Node
// SDK sends unless told otherwise, gets the vector of Unary's answer as base64 float32s;
// without it, the floats.
func TestEmbeddingsInBase64(t *testing.T) {
	srv := httptest.NewServer(New())
	defer srv.Close()
	call := 0
	for _, tc := range []struct{ body, format string }{
		{`{"model":"m","input":"x","encoding_format":"base64"}`, "base64"},
		{`{"model":"m","input":"x","encoding_format":"float"}`, "float"},
		{`{"model":"m","input":"x"}`, "float"},
	} {
		call++
		resp, err := http.Post(srv.URL+"/v1/embeddings", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Data []struct {
				Embedding json.RawMessage `json:"embedding"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || len(got.Data) != 1 {
			t.Fatalf("%s: %v, %+v", tc.body, err, got)
		}
		var vec []float32
		if tc.format == "base64" {
			var s string
			if err := json.Unmarshal(got.Data[0].Embedding, &s); err != nil {
				t.Fatalf("%s: embedding %s; want a base64 string", tc.body, got.Data[0].Embedding)
			}
			raw, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(raw)%4 != 0 {
				t.Fatalf("%s: embedding %q: %v", tc.body, s, err)
			}
			for i := 0; i < len(raw); i += 4 {
				vec = append(vec, math.Float32frombits(binary.LittleEndian.Uint32(raw[i:])))
			}
		} else if err := json.Unmarshal(got.Data[0].Embedding, &vec); err != nil {
			t.Fatalf("%s: embedding %s; want floats", tc.body, got.Data[0].Embedding)
		}
		if want := []float32{float32(call), 0.5, -0.25}; !slices.Equal(vec, want) {
			t.Errorf("%s: vector %v; want %v", tc.body, vec, want)
		}
	}
}

// TestHealthzIsNoCall: GET /healthz answers 200 and counts no call, so that a health check
// of a fake in a container leaves its counts to the requests.
func TestHealthzIsNoCall(t *testing.T) {
	u := New()
	srv := httptest.NewServer(u)
	defer srv.Close()
	res, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || u.Calls() != 0 {
		t.Errorf("GET /healthz: %d, %d calls counted; want 200 and none", res.StatusCode, u.Calls())
	}
}
