package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestPassedThroughBodyGoesOnAfterTheAnswerBegins: the reverse proxy's transport writes
// the request body upstream while the answer comes back (full duplex). Here the upstream
// answers before it reads the body, and the client sends the body's second half only once
// the answer has begun: the upstream must still get the whole body, and the client the
// whole stream.
func TestPassedThroughBodyGoesOnAfterTheAnswerBegins(t *testing.T) {
	gotBody := make(chan string, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).EnableFullDuplex()
		http.NewResponseController(w).Flush()
		b, _ := io.ReadAll(r.Body)
		gotBody <- string(b)
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(gw.Close)
	in := newInstance(t, startUpstream(t), setup{base: gw.URL})
	conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"first half":"` + strings.Repeat("a", 100) + `","second half":"` + strings.Repeat("b", 100) + `"}`
	half := len(body) / 2
	fmt.Fprintf(conn, "POST /v1/threads/runs HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:half])
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewReader(res.Body)
	if l, err := sc.ReadString('\n'); err != nil || l != "data: first\n" {
		t.Fatalf("first line %q (%v)", l, err)
	}
	io.WriteString(conn, body[half:])
	rest, err := io.ReadAll(sc)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the rest of the stream %q, then %v; want it whole", rest, err)
	}
	if b := <-gotBody; b != body {
		t.Fatalf("the upstream got a body of %d bytes; want the client's %d", len(b), len(body))
	}
}
