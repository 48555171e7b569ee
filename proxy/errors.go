package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// errAborted is why an answer begun was cut when its handler panicked: the reverse proxy
// does so when its copy fails.
var errAborted = errors.New("the answer's handler panicked (the reverse proxy's abort when its copy fails)")

// isTimeout reports whether err is a deadline's, of a context or of a connection.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err) // unlike errors.As, no allocation: the last read of every request body comes here
	return ok && ne.Timeout()
}

// writeError answers with an error object in the form the OpenAI API and its SDKs use:
// {"error":{"message":…,"type":…,"code":…}}.
func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(errorJSON(typ, code, message), '\n'))
}

// errorJSON is an error object in the OpenAI shape, {"error":{"message","type","code"}}:
// the one form of every error the proxy makes, whether written at once, shared with a
// flight's followers or sent as an SSE event.
func errorJSON(typ, code, message string) []byte {
	type body struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	b, _ := json.Marshal(map[string]body{"error": {Message: message, Type: typ, Code: code}})
	return b
}

// failure is an answer made by the proxy in the OpenAI error shape, for a failed attempt.
func failure(status int, code, msg string) singleflight.Result {
	return failureOf("upstream_error", status, code, msg)
}

// failureOf is failure with the error's type: server_error for what the proxy did.
func failureOf(typ string, status int, code, msg string) singleflight.Result {
	return singleflight.Result{
		Head:    singleflight.Head{Status: status, Header: map[string][]string{"Content-Type": {"application/json"}}},
		Body:    append(errorJSON(typ, code, msg), '\n'),
		Outcome: singleflight.Retry,
	}
}

// transportFailure is the answer of an attempt whose call failed: why, as far as ctx's
// cause and err tell.
func transportFailure(ctx context.Context, err error) singleflight.Result {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, singleflight.ErrShutdown):
		return failureOf("server_error", http.StatusServiceUnavailable, "shutting_down", "the proxy is shutting down; retry")
	case errors.Is(err, errIdle) || errors.Is(cause, errIdle):
		return failure(http.StatusGatewayTimeout, "upstream_idle_timeout", "the upstream API stopped sending")
	case errors.Is(cause, singleflight.ErrTimeout) || isTimeout(err):
		return failure(http.StatusGatewayTimeout, "upstream_timeout", "the upstream API did not answer in time")
	}
	return failure(http.StatusBadGateway, "upstream_unavailable", "the upstream API could not be reached")
}

// failBeforeBytes answers a request whose flight ended before any byte was sent, with no
// response to share. A call that ran out of time is not one of them: its attempt's answer
// is transportFailure's 504, shared as any response.
func (p *Proxy) failBeforeBytes(w http.ResponseWriter, ctx context.Context, err error) {
	switch {
	case ctx.Err() != nil:
		// The client left; nobody reads an answer.
	case errors.Is(err, singleflight.ErrShutdown):
		writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "the proxy is shutting down; retry")
	default:
		writeError(w, http.StatusBadGateway, "upstream_error", "upstream_failed", "the upstream API call failed on every attempt")
	}
}
