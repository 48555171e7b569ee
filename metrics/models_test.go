package metrics

import (
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func modelName(i int) string { return fmt.Sprintf("model-%03d", i) }

func TestModelCap(t *testing.T) {
	const extra = 25
	m, _ := newTest(t)
	// More distinct models than the cap, each saving i+1 prompt tokens; then one model from
	// before the cap again, and requests without a model.
	var overflow float64
	for i := range MaxModels + extra {
		m.Saved("/v1/chat/completions", modelName(i), int64(i+1), 0)
		if i >= MaxModels {
			overflow += float64(i + 1)
		}
	}
	m.Saved("/v1/chat/completions", modelName(0), 1000, 0)
	m.Saved("/v1/chat/completions", "", 5, 0)
	m.Saved("/v1/chat/completions", "", 6, 0)

	tests := []struct {
		model string
		want  float64
	}{
		{modelName(0), 1 + 1000},
		{modelName(MaxModels - 1), MaxModels},
		{modelOther, overflow},
		{modelUnknown, 5 + 6},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			if got := testutil.ToFloat64(m.savedTokens.WithLabelValues(tc.model, "prompt")); got != tc.want {
				t.Errorf("got %g; want %g", got, tc.want)
			}
		})
	}
	// MaxModels real models, plus "other" and "unknown".
	if got, want := testutil.CollectAndCount(m.savedTokens), MaxModels+2; got != want {
		t.Errorf("got %d series; want %d", got, want)
	}
	if got := testutil.ToFloat64(m.savedRequests.WithLabelValues("/v1/chat/completions")); got != MaxModels+extra+3 {
		t.Errorf("got %g saved requests; want %d", got, MaxModels+extra+3)
	}
}

func TestModelSetLabel(t *testing.T) {
	s := modelSet{max: 2}
	tests := []struct{ in, want string }{
		{"a", "a"},
		{"", modelUnknown},
		{"b", "b"},
		{"c", modelOther},
		{"a", "a"},
		{"b", "b"},
		{"d", modelOther},
	}
	for i, tc := range tests {
		if got := s.label(tc.in); got != tc.want {
			t.Errorf("step %d: label(%q) = %q; want %q", i, tc.in, got, tc.want)
		}
	}
}

// TestModelLabelLength: the model string is the client's, so its length is bounded too: a
// 2 MiB model name must not become a 2 MiB label value on /metrics, whoever sends it.
func TestModelLabelLength(t *testing.T) {
	m, reg := newTest(t)
	huge := strings.Repeat("m", 2<<20)
	for i := range 5 {
		m.Saved("/v1/chat/completions", huge+strconv.Itoa(i), 10, 10)
	}
	m.Saved("/v1/chat/completions", "bad\xffutf8", 1, 0)
	page := scrape(t, reg)
	if len(page) > 256<<10 {
		t.Errorf("/metrics is %d bytes after five requests with a 2 MiB model; want it bounded (< 256 KiB)", len(page))
	}
	if got := testutil.ToFloat64(m.savedTokens.WithLabelValues(modelOther, "prompt")); got != 5*10+1 {
		t.Errorf("saved_tokens{model=%q}: got %g; want %d (the long and the invalid names)", modelOther, got, 5*10+1)
	}
	if got := len(m.models.seen); got != 0 {
		t.Errorf("got %d models remembered; want 0: a name that is not used as a label must not use up the cap", got)
	}
}

// scrape returns the text exposition of reg, as /metrics serves it.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: status %d: %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}
