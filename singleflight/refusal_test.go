package singleflight

import (
	"context"
	"errors"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestRefusedNamesWhatRedisRefuses(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := srv.Client()
	if err := rdb.Do(ctx, "ACL", "SETUSER", "limited", "on", ">pw", "~*", "+get").Err(); err != nil {
		t.Fatal(err)
	}
	limited := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, Username: "limited", Password: "pw", MaxRetries: -1})
	defer limited.Close()
	// A user that may run scripts on its keys but not publish on the proxy's channels.
	if err := rdb.Do(ctx, "ACL", "SETUSER", "nochannel", "on", ">pw", "~*", "resetchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	nochannel := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, Username: "nochannel", Password: "pw", MaxRetries: -1})
	defer nochannel.Close()
	for _, c := range []struct {
		name string
		err  error
		want Refusal
		down bool // unavailable: the shard degrades
	}{
		{"wrong password", rdb.Do(ctx, "AUTH", "nobody", "wrong").Err(), RefusedAuth, true},
		{"command not permitted", limited.Set(ctx, "k", "v", 0).Err(), RefusedPermission, true},
		{"a script's channel not permitted", usableScript.Run(ctx, nochannel, []string{"p:probe"}).Err(), RefusedPermission, true},
		// Redis 7.2 and later, and Valkey, word a script's refusal so (this machine runs 7.0).
		{"a script's channel not permitted, Redis 7.2", scriptError("ERR ACL failure in script: No permissions to access a channel script: 1a2b, on @user_script:1."), RefusedPermission, true},
		{"a script's command not permitted, Valkey 8", scriptError("ERR ACL failure in script: No permissions to run the 'publish' command script: 1a2b, on @user_script:1."), RefusedPermission, true},
		{"database out of range", rdb.Do(ctx, "SELECT", 99999).Err(), RefusedDB, true},
		{"not a Cluster", rdb.Do(ctx, "CLUSTER", "SLOTS").Err(), RefusedNotCluster, true},
		{"a reply to one command", rdb.Do(ctx, "INCR", "not-a-number-"+uniqueKey(), "extra").Err(), NotRefused, false},
		{"network", errors.New("dial tcp: connection refused"), NotRefused, true},
		{"pool busy", redis.ErrPoolTimeout, NotRefused, false},
	} {
		if c.err == nil {
			t.Fatalf("%s: Redis answered without an error", c.name)
		}
		if got := Refused(c.err); got != c.want {
			t.Errorf("%s: Refused(%q) = %d; want %d", c.name, c.err, got, c.want)
		}
		if got := unavailable(c.err); got != c.down {
			t.Errorf("%s: unavailable(%q) = %v; want %v", c.name, c.err, got, c.down)
		}
	}
}

// scriptError is a Redis error reply as go-redis hands it on.
type scriptError string

func (e scriptError) Error() string { return string(e) }
func (scriptError) RedisError()     {}
