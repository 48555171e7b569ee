package singleflight

import (
	"context"
	"errors"
	"strconv"
)

// errStreamFull says the flight's stream holds StreamMaxLen entries: the owner stops
// appending, and its final write carries the rest.
var errStreamFull = errors.New("singleflight: stream full")

// remoteOwnership is one owned attempt in Redis: every write is fenced by token.
type remoteOwnership struct {
	r     *remote
	key   string
	k     flightKeys
	token string
}

func (o *remoteOwnership) remote() bool { return true }

// fenced turns a script's 0 into ErrLeaseLost.
func (o *remoteOwnership) fenced(op string, v int64, err error) error {
	if err != nil {
		return o.r.redisErr(op, o.key, err)
	}
	if v == 0 {
		return ErrLeaseLost
	}
	return nil
}

func (o *remoteOwnership) renew(ctx context.Context) error {
	opts := o.r.g.opts
	v, err := renewScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream},
		o.token, opts.LeaseTTL.Milliseconds(), o.r.runningTTL()).Int64()
	return o.fenced("renew", v, err)
}

func (o *remoteOwnership) appendBatch(ctx context.Context, n int, head *Head, data []byte) error {
	status, header := "", ""
	if head != nil {
		status, header = strconv.Itoa(head.Status), encodeHeader(head.Header)
	}
	v, err := appendScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream},
		o.token, n, status, header, data, o.r.runningTTL(), o.r.g.opts.StreamMaxLen).Int64()
	if err == nil && v == 2 {
		return errStreamFull
	}
	return o.fenced("append", v, err)
}

func (o *remoteOwnership) complete(ctx context.Context, fin final) error {
	opts := o.r.g.opts
	v, err := completeScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream, o.k.result},
		o.token, fin.landedN, fin.skip, fin.head.Status, encodeHeader(fin.head.Header), fin.tail, fin.transcript,
		flag(fin.store), opts.ResultTTL.Milliseconds(), opts.Linger.Milliseconds()).Int64()
	return o.fenced("complete", v, err)
}

func (o *remoteOwnership) fail(ctx context.Context, res Result, reason string) error {
	status := ""
	if res.Head.Status != 0 {
		status = strconv.Itoa(res.Head.Status)
	}
	v, err := failScript.Run(ctx, o.r.rdb, []string{o.k.meta, o.k.stream},
		o.token, status, encodeHeader(res.Head.Header), res.Body, reason, o.r.runningTTL()).Int64()
	return o.fenced("fail", v, err)
}
