package singleflight

import "context"

// Check asks Redis whether it answers, so that a configuration Redis refuses (a wrong
// password, a TLS certificate not trusted) shows at start-up and not at the first request:
// a failure that makes Redis unusable degrades the Group, as any command's would, and is
// reported with EventDegraded. An in-memory Group has nothing to check.
func (g *Group) Check(ctx context.Context) error {
	if g.remote == nil {
		return nil
	}
	r := g.remote
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		r.g.observe(Event{Kind: EventRedisError, Op: "ping", Err: err})
		if unavailable(err) {
			r.degrade("", err) // a Cluster that refuses a PING refuses every shard
		}
		return err
	}
	return nil
}
