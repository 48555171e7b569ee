package tracing

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckNamesTheVariable: each OTEL_* value tracing would read and cannot use is an
// *EnvError naming its variable; what tracing does not read is not looked at.
func TestCheckNamesTheVariable(t *testing.T) {
	const endpoint = "http://127.0.0.1:4318"
	missing := filepath.Join(t.TempDir(), "ca.pem")
	for _, tc := range []struct {
		env  map[string]string
		want string // the variable named; "" for no error
	}{
		{map[string]string{}, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp,zipkin", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "jaeger", "OTEL_SDK_DISABLED": "true"}, ""},
		{map[string]string{"OTEL_SDK_DISABLED": "yes"}, "OTEL_SDK_DISABLED"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "False"}, ""},

		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "ratio"}, "OTEL_TRACES_SAMPLER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10%"}, "OTEL_TRACES_SAMPLER_ARG"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "x"}, ""},
		{map[string]string{"OTEL_TRACES_SAMPLER": "ratio"}, ""}, // tracing off: not read
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "team=a,region"}, "OTEL_RESOURCE_ATTRIBUTES"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "team=a%2Cb,region=eu"}, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SPAN_LINK_COUNT_LIMIT": "many"}, "OTEL_SPAN_LINK_COUNT_LIMIT"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SPAN_LINK_COUNT_LIMIT": "-1"}, ""},

		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "::4318"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_HEADERS": "Authorization: Bearer x"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x,x-team=a"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "1"}, "OTEL_EXPORTER_OTLP_INSECURE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_CERTIFICATE": missing}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, "OTEL_BSP_MAX_QUEUE_SIZE"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "-5"}, "OTEL_BSP_SCHEDULE_DELAY"},
		// The OTLP exporter's variables are not read when it does not export.
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, ""},
	} {
		err := Check(env(tc.env))
		if tc.want == "" {
			if err != nil {
				t.Errorf("Check(%v) = %v; want nil", tc.env, err)
			}
			continue
		}
		var ee *EnvError
		if !errors.As(err, &ee) || ee.Name != tc.want || !strings.HasPrefix(err.Error(), tc.want+": ") {
			t.Errorf("Check(%v) = %v; want an error naming %s", tc.env, err, tc.want)
		}
	}
}

// TestCheckReportsEveryValue: several values that cannot be used are reported together,
// so that one start-up shows all of them.
func TestCheckReportsEveryValue(t *testing.T) {
	err := Check(env(map[string]string{"OTEL_SDK_DISABLED": "no", "OTEL_TRACES_EXPORTER": "console,jaeger", "OTEL_TRACES_SAMPLER": "sometimes"}))
	j, ok := err.(interface{ Unwrap() []error })
	if !ok || len(j.Unwrap()) != 3 {
		t.Fatalf("Check = %v; want three errors, one per variable", err)
	}
}
