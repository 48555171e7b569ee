package metrics

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeListsEveryLabelValue: the README's metrics table lists the label values the
// code knows in advance, each of them and no other, so that an alert written from it
// matches what /metrics serves; and a help text that lists them lists them all.
func TestReadmeListsEveryLabelValue(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, reg := newTest(t)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	help := map[string]string{}
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
	}
	word := regexp.MustCompile("`([a-z_]+)`")
	for _, tc := range []struct {
		metric, label string
		values        []string
		inHelp        bool // the help text lists them too
	}{
		{"takeovers_total", "reason", takeoverReasons, true},
		{"redis_errors_total", "op", redisOps, false},
		{"purges_total", "kind", purgeKinds, true},
		{"purge_invalidations_total", "kind", invalidationKinds, true},
		{"abandoned_flights_total", "outcome", abandonOutcomes, true},
		// flight_roles_total's row lists no values ("protocol detail"): its help does.
		{"flight_roles_total", "role", flightRoles, true},
	} {
		row := regexp.MustCompile("(?m)^\\| [^|]*`" + tc.metric + `\{` + tc.label + "\\}`[^|]*\\|(.*)$").FindSubmatch(b)
		if row == nil {
			t.Errorf("README.md has no metrics row for %s{%s}", tc.metric, tc.label)
			continue
		}
		var listed []string
		for _, m := range word.FindAllSubmatch(row[1], -1) {
			if w := string(m[1]); w != tc.label && !strings.HasSuffix(w, "_total") {
				listed = append(listed, w)
			}
		}
		if tc.metric != "flight_roles_total" {
			for _, v := range tc.values {
				if !slices.Contains(listed, v) {
					t.Errorf("README.md, %s{%s}: %q is not listed; the code has %v", tc.metric, tc.label, v, tc.values)
				}
			}
		}
		for _, w := range listed {
			if !slices.Contains(tc.values, w) {
				t.Errorf("README.md, %s{%s}: lists %q, which the code does not have (%v)", tc.metric, tc.label, w, tc.values)
			}
		}
		for _, v := range tc.values {
			if tc.inHelp && !regexp.MustCompile(`\b`+v+`\b`).MatchString(help[namespace+"_"+tc.metric]) {
				t.Errorf("the help of %s does not name %s %q: %q", tc.metric, tc.label, v, help[namespace+"_"+tc.metric])
			}
		}
	}
}
