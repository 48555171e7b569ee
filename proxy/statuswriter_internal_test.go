package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestStatusWriter: the status recorded for the log line and the metrics is the one the
// client gets, whatever way the handler writes it.
func TestStatusWriter(t *testing.T) {
	for _, tt := range []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing", func(http.ResponseWriter) {}, 0},
		{"header", func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }, http.StatusCreated},
		{"body only", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, http.StatusOK},
		{"flush first", func(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }, http.StatusOK},
		{"twice", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTeapot)
			w.WriteHeader(http.StatusInternalServerError)
		}, http.StatusTeapot},
		{"early hints", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusAccepted)
		}, http.StatusAccepted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			w := &statusWriter{ResponseWriter: rec}
			tt.write(w)
			if w.status != tt.want {
				t.Errorf("recorded %d; want %d", w.status, tt.want)
			}
			if tt.want != 0 && tt.name != "early hints" && rec.Code != tt.want { // the recorder keeps a 1xx
				t.Errorf("the client got %d; want %d", rec.Code, tt.want)
			}
		})
	}
}
