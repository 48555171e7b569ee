package sim

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	// go-redis logs the dials the simulated faults refuse; the history has them.
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
