// go-redis draws its retry backoff from math/rand's global source: seeded per run (see
// seedGlobal), a story's retries come at the same virtual times every run.
//go:debug randseednop=0

package sim

import (
	"context"
	"math/rand"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	// go-redis logs the dials the simulated faults refuse; the history has them.
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// seedGlobal seeds math/rand's global source, which go-redis draws its retry backoff from.
// Runs in parallel share it: only a run alone (a story, a replayed seed) is repeatable.
func seedGlobal(seed int64) {
	rand.Seed(seed) // deprecated for programs; a simulator wants it
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
