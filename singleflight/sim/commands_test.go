package sim

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// What an instance asks Redis, as the timeline shows it: a go-redis hook on the instance's
// client, outside the project's code, names each script by its SHA and each reply by what
// the project makes of it.

// scriptNames maps the SHA of every script the project can send (each file of ../lua, alone
// or after wake.lua, or after wake.lua and restore.lua, as remote.go builds them) to its name.
var scriptNames = sync.OnceValue(func() map[string]string {
	files, err := filepath.Glob("../lua/*.lua")
	if err != nil || len(files) == 0 {
		panic(fmt.Sprintf("the project's scripts: %v", err))
	}
	src := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			panic(err)
		}
		src[strings.TrimSuffix(filepath.Base(f), ".lua")] = string(b)
	}
	names := map[string]string{}
	for name, s := range src {
		for _, full := range []string{s, src["wake"] + s, src["wake"] + src["restore"] + s} {
			h := sha1.Sum([]byte(full))
			names[hex.EncodeToString(h[:])] = name
		}
	}
	return names
})

// recorder is the hook: it adds each command's outcome to the history.
type recorder struct {
	inst *instance
}

func (r recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && cmd.Err() == nil {
			cmd.SetErr(err)
		}
		r.record(cmd)
		return err
	}
}

func (r recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if err != nil && c.Err() == nil {
				c.SetErr(err)
			}
			r.record(c)
		}
		return err
	}
}

func (r recorder) record(cmd redis.Cmder) {
	w := r.inst.w
	if r.inst.dead.Load() {
		return
	}
	name, key, reply, ok := summarize(cmd)
	if !ok {
		return
	}
	w.stats.command(name)
	if a := cmd.Args(); name == "complete" && len(a) > 14 {
		switch {
		case reply == "completed" && argString(a[13]) == "1":
			w.acked(key, argString(a[14]), argString(a[12]))
		case reply == "fenced":
			w.fencedAnswer(argString(a[12]))
		}
	}
	if w.cfg.verbose == nil || !w.cfg.verbose(name, reply) {
		return
	}
	where := caller()
	if key != "" {
		w.hist.add(r.inst.id, kRedis, where, "%s: %s → %s", key, name, reply)
	} else {
		w.hist.add(r.inst.id, kRedis, where, "%s → %s", name, reply)
	}
}

// argString is a command's argument as Redis reads it.
func argString(a any) string {
	if b, ok := a.([]byte); ok {
		return string(b)
	}
	return fmt.Sprint(a)
}

// summarize names a command, the flight key it is about, and its reply in a word or two.
func summarize(cmd redis.Cmder) (name, key, reply string, ok bool) {
	args := cmd.Args()
	if len(args) == 0 {
		return "", "", "", false
	}
	name = strings.ToLower(fmt.Sprint(args[0]))
	switch name {
	case "hello", "client", "auth", "select", "command", "cluster", "readonly", "script":
		return "", "", "", false
	case "evalsha", "eval":
		if len(args) > 1 {
			h := fmt.Sprint(args[1])
			if name == "eval" {
				s := sha1.Sum([]byte(h))
				h = hex.EncodeToString(s[:])
			}
			if n, ok := scriptNames()[h]; ok {
				name = n
			} else {
				name = "script " + h[:8]
			}
		}
		if len(args) > 3 {
			key = flightKey(fmt.Sprint(args[3]))
		}
	default:
		for _, a := range args[1:] {
			if key = flightKey(fmt.Sprint(a)); key != "" {
				break
			}
		}
	}
	return name, key, replyWord(name, cmd), true
}

// flightKey is K of a key "P:kind:{K}", or "".
func flightKey(s string) string {
	i, j := strings.IndexByte(s, '{'), strings.LastIndexByte(s, '}')
	if i < 0 || j < i {
		return ""
	}
	return s[i+1 : j]
}

func replyWord(name string, cmd redis.Cmder) string {
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return "noscript"
	}
	if err := cmd.Err(); err != nil && err != redis.Nil {
		// Its deadline and its context's end come at one instant: either may end it.
		if ne, ok := err.(net.Error); ok && ne.Timeout() || errors.Is(err, context.Canceled) {
			return "no answer"
		}
		return errWord(err)
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return "ok"
	}
	v := c.Val()
	switch name {
	case "renew":
		return pick(v, map[int64]string{0: "fenced", -1: "gone", -2: "cut"}, "renewed")
	case "append":
		return pick(v, map[int64]string{1: "appended", 0: "fenced", 2: "full", -1: "gone", -2: "cut"}, "?")
	case "complete", "fail":
		return pick(v, map[int64]string{1: map[string]string{"complete": "completed", "fail": "failed"}[name], 0: "fenced", -1: "gone"}, "?")
	case "unwait":
		return pick(v, map[int64]string{1: "unmarked", 0: "no mark"}, "?")
	case "incr", "purge_ns":
		return "ok"
	}
	if v == nil {
		return "nil"
	}
	if a, ok := v.([]any); ok && len(a) > 0 {
		s := fmt.Sprint(a[0])
		if s == "claim" && len(a) > 3 {
			s += " (" + fmt.Sprint(a[3]) + ")"
		}
		return s
	}
	return fmt.Sprint(v)
}

func pick(v any, words map[int64]string, other string) string {
	if n, ok := v.(int64); ok {
		if w, ok := words[n]; ok {
			return w
		}
	}
	return other
}
