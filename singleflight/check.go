package singleflight

import "context"

// Check asks Redis, on both clients, whether it answers, so that a configuration Redis
// refuses (a wrong password, a TLS certificate not trusted) shows at start-up and not at
// the first request: a failure that makes Redis unusable degrades the Group, as any
// command's would, and is reported with EventDegraded. An in-memory Group has nothing to
// check.
func (g *Group) Check(ctx context.Context) error {
	if g.remote == nil {
		return nil
	}
	r := g.remote
	err := r.rdb.Ping(ctx).Err()
	if err == nil && r.block != r.rdb {
		err = r.block.Ping(ctx).Err()
	}
	if err != nil {
		return r.redisErr("ping", err)
	}
	return nil
}
