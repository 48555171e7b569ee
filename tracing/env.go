package tracing

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// EnvError is a value of an OTEL_* variable that tracing cannot use: the variable and the
// rule it breaks, so that the message names what to change.
type EnvError struct {
	Name string // the variable, like OTEL_TRACES_EXPORTER
	Rule string
}

func (e *EnvError) Error() string { return e.Name + ": " + e.Rule }

// Check returns every OTEL_* value tracing would read and cannot use, each an *EnvError,
// joined; nil when there is none. The SDK would log such a value and go on with its
// default (every request sampled where one in ten was asked, no Authorization header on
// the exports): the proxy refuses it at start-up instead, as it refuses an invalid
// configuration. What tracing does not read is not checked: nothing but OTEL_SDK_DISABLED
// when it is true, nothing but the exporter list when tracing is off, and the OTLP
// exporter's variables only when it exports. See ADR 0079.
func Check(getenv func(string) string) error {
	var errs []error
	fail := func(name, format string, args ...any) {
		errs = append(errs, &EnvError{Name: name, Rule: fmt.Sprintf(format, args...)})
	}
	switch v := strings.TrimSpace(getenv("OTEL_SDK_DISABLED")); {
	case strings.EqualFold(v, "true"):
		return nil
	case v != "" && !strings.EqualFold(v, "false"):
		fail("OTEL_SDK_DISABLED", "must be true or false, got %q", v)
	}
	otlp, console, err := exporters(getenv)
	if err != nil {
		errs = append(errs, err)
	}
	if !otlp && !console {
		return errors.Join(errs...)
	}

	sampler := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	switch sampler {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
	case "traceidratio", "parentbased_traceidratio":
		if arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")); arg != "" {
			if r, err := strconv.ParseFloat(arg, 64); err != nil || r < 0 || r > 1 {
				fail("OTEL_TRACES_SAMPLER_ARG", "must be a ratio from 0 to 1 (0.1 traces one request in ten), got %q", arg)
			}
		}
	default:
		fail("OTEL_TRACES_SAMPLER", "%q is not supported: use parentbased_always_on (the default), parentbased_traceidratio, "+
			"parentbased_always_off, always_on, always_off or traceidratio", sampler)
	}
	pairs(getenv, "OTEL_RESOURCE_ATTRIBUTES", fail)
	for _, name := range []string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
		"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
		"OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"} {
		integer(getenv, name, true, fail)
	}
	if !otlp {
		return errors.Join(errs...)
	}

	if _, err := protocol(getenv); err != nil {
		errs = append(errs, err)
	}
	for _, signal := range []string{"", "TRACES_"} {
		prefix := "OTEL_EXPORTER_OTLP_" + signal
		if v := getenv(prefix + "ENDPOINT"); v != "" {
			if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				fail(prefix+"ENDPOINT", "must be an http or https URL, like http://otel-collector:4318, got %q", v)
			}
		}
		integer(getenv, prefix+"TIMEOUT", false, fail)
		pairs(getenv, prefix+"HEADERS", fail)
		if v := getenv(prefix + "COMPRESSION"); v != "" && v != "gzip" && v != "none" {
			fail(prefix+"COMPRESSION", "must be gzip or none, got %q", v)
		}
		if v := getenv(prefix + "INSECURE"); v != "" && !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
			fail(prefix+"INSECURE", "must be true or false, got %q", v)
		}
		for _, file := range []string{"CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			if v := getenv(prefix + file); v != "" {
				if _, err := os.Stat(v); err != nil {
					fail(prefix+file, "cannot read %s: %v", v, errors.Unwrap(err))
				}
			}
		}
	}
	for _, name := range []string{"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"} {
		integer(getenv, name, false, fail)
	}
	return errors.Join(errs...)
}

// integer checks a variable the SDK reads as a whole number: milliseconds (a name ending in
// TIMEOUT or DELAY) or a count, not negative unless a negative value means no limit.
func integer(getenv func(string) string, name string, negative bool, fail func(name, format string, args ...any)) {
	v := getenv(name)
	if v == "" {
		return
	}
	what := "a whole number, 0 or more"
	switch {
	case negative:
		what = "a whole number (negative: no limit)"
	case strings.HasSuffix(name, "TIMEOUT") || strings.HasSuffix(name, "DELAY"):
		what = "a whole number of milliseconds, 0 or more"
	}
	if n, err := strconv.Atoi(v); err != nil || (n < 0 && !negative) {
		fail(name, "must be %s, got %q", what, v)
	}
}

// pairs checks a list of key=value pairs, separated by commas, the values percent-encoded:
// the form of OTEL_RESOURCE_ATTRIBUTES and the OTLP headers.
func pairs(getenv func(string) string, name string, fail func(name, format string, args ...any)) {
	v := getenv(name)
	if v == "" {
		return
	}
	for _, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(p, "=")
		if _, err := url.PathUnescape(val); !ok || strings.TrimSpace(k) == "" || err != nil {
			fail(name, "must be key=value pairs separated by commas (a value percent-encoded), got %q", p)
			return
		}
	}
}
