package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// TestErrorAnswersHaveTheOpenAIShape: every error the proxy makes is
// {"error":{"message","type","code"}}, whatever its text holds, sent as JSON that a
// browser will not sniff as anything else.
func TestErrorAnswersHaveTheOpenAIShape(t *testing.T) {
	rec := httptest.NewRecorder()
	writeError(rec, http.StatusTeapot, "invalid_request_error", "odd", `a "quoted" <b>message</b>`)
	var got struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if got.Error.Message != `a "quoted" <b>message</b>` || got.Error.Type != "invalid_request_error" || got.Error.Code != "odd" {
		t.Errorf("got %+v; want the message, type and code given", got.Error)
	}
	if rec.Code != http.StatusTeapot || rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("got %d, %v; want 418, application/json, nosniff", rec.Code, rec.Header())
	}
}

// TestTransportFailureSaysWhatEndedTheCall: a failed attempt's answer names the cause:
// shutdown, an upstream gone quiet, a deadline, or an upstream that could not be reached.
// Each may be retried by another attempt.
func TestTransportFailureSaysWhatEndedTheCall(t *testing.T) {
	cancelled := func(cause error) context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		return ctx
	}
	for _, tt := range []struct {
		name   string
		ctx    context.Context
		err    error
		status int
		typ    string
		code   string
	}{
		{"shutdown", cancelled(singleflight.ErrShutdown), context.Canceled, 503, "server_error", "shutting_down"},
		{"idle", cancelled(errIdle), context.Canceled, 504, "upstream_error", "upstream_idle_timeout"},
		{"flight timeout", cancelled(singleflight.ErrTimeout), context.Canceled, 504, "upstream_error", "upstream_timeout"},
		{"deadline", context.Background(), context.DeadlineExceeded, 504, "upstream_error", "upstream_timeout"},
		{"refused", context.Background(), errors.New("connection refused"), 502, "upstream_error", "upstream_unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := transportFailure(tt.ctx, tt.err)
			var got struct {
				Error struct{ Type, Code string }
			}
			if err := json.Unmarshal(res.Body, &got); err != nil {
				t.Fatalf("body %q: %v", res.Body, err)
			}
			if res.Head.Status != tt.status || got.Error.Type != tt.typ || got.Error.Code != tt.code || res.Outcome != singleflight.Retry {
				t.Errorf("got %d %s %s, outcome %v; want %d %s %s, Retry", res.Head.Status, got.Error.Type, got.Error.Code, res.Outcome, tt.status, tt.typ, tt.code)
			}
		})
	}
}

// TestFailBeforeBytesSaysWhyTheFlightEnded: a request whose flight ended before any byte
// was sent gets an error that names why, wrapped as the flight wraps it: 503 when the proxy
// shuts down, 502 when every attempt failed with no answer to share; a client that left
// gets nothing written.
func TestFailBeforeBytesSaysWhyTheFlightEnded(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name   string
		ctx    context.Context
		err    error
		status int // 0: nothing written
		typ    string
		code   string
	}{
		{"shutdown", context.Background(), errors.Join(singleflight.ErrFailed, singleflight.ErrShutdown), 503, "server_error", "shutting_down"},
		{"failed", context.Background(), singleflight.ErrFailed, 502, "upstream_error", "upstream_failed"},
		{"client gone", gone, errors.Join(singleflight.ErrFailed, singleflight.ErrShutdown), 0, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			(&Proxy{}).failBeforeBytes(rec, tt.ctx, tt.err)
			if tt.status == 0 {
				if rec.Body.Len() != 0 || len(rec.Header()) != 0 {
					t.Fatalf("wrote %d %v %q; want nothing for a client that left", rec.Code, rec.Header(), rec.Body)
				}
				return
			}
			var got struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != tt.status || got.Error.Type != tt.typ || got.Error.Code != tt.code || got.Error.Message == "" {
				t.Errorf("got %d %s %s %q; want %d %s %s and a message", rec.Code, got.Error.Type, got.Error.Code, got.Error.Message, tt.status, tt.typ, tt.code)
			}
		})
	}
}
