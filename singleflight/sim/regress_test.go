package sim

import (
	"fmt"
	"testing"
)

// regressionSeeds are seeds whose schedules broke an invariant before a fix, and what
// they showed; a seed's schedule is stable, so each keeps its case. TestRegressionSeeds
// runs them with every go test.
var regressionSeeds = []struct {
	seed int64
	what string
}{
	{529, "a Cluster master that holds an instance's pub/sub connection hangs: followers of flights on other masters waited for their lease (ADR 0081)"},
	{3470, "the same, with four instances"},
	{2175, "a master slower than the Redis timeout failed the first renewals of another master's flight: a second call (ADR 0081)"},
	{3017, "a hung master failed the first renewals of another master's flight: a second call"},
	{9584, "the same"},
	{17648, "the same, while a third master answered late"},
}

// TestRegressionSeeds runs regressionSeeds: each must break no invariant.
func TestRegressionSeeds(t *testing.T) {
	for _, r := range regressionSeeds {
		t.Run(fmt.Sprint(r.seed), func(t *testing.T) {
			t.Parallel()
			if w := explore(t, r.seed, false); len(w.viol) > 0 {
				t.Logf("seed %d once showed: %s", r.seed, r.what)
			}
		})
	}
}
