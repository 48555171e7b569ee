package sim

import (
	"flag"
	"testing"
	"testing/synctest"
)

var dbgSeed = flag.Int64("dbg", 1, "")

func TestDbg(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, drive := scenario(*dbgSeed)
		cfg.verbose = func(name, reply string) bool { return name != "renew" || reply != "renewed" }
		w := newWorld(t, cfg)
		drive(w)
		w.run(w.cfg.opts.Linger + w.cfg.opts.LeaseTTL)
		t.Log("\n" + timeline(w.hist.all(), 0, kClient, kCall, kFlight, kRedis, kFault))
		for _, v := range w.viol {
			t.Log(v)
		}
	})
}
