package wake

import (
	"strings"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight/internal/poll"
	"github.com/redis/go-redis/v9"
)

// The connection: the sender opens it and alone sends on it, the receiver reads it. Where
// Config.Node names its server, it moves to another when that one fails, hangs (Leave) or
// leaves a PING unanswered for ConfirmWithin while followers wait on it (ADR 0081).

// conn is the hub's connection; Hub.mu guards it.
type conn struct {
	ps     *redis.PubSub // nil until the sender opened it
	node   string        // its server, as Config.Node named it; "": go-redis chose
	opened chan struct{} // closed, and replaced, when ps changes; nil until started
	leave  bool          // the sender is to open a new connection, off node
}

// hubEpoch is what Hub.heard counts from.
var hubEpoch = time.Now()

// start starts the sender and the receiver once; h.mu held.
func (h *Hub[E]) start() error {
	if h.c.opened != nil {
		return nil
	}
	if h.cfg.Ctx.Err() != nil {
		return ErrClosed
	}
	h.c.opened = make(chan struct{})
	h.cfg.WG.Add(2)
	go h.send()
	go h.receive()
	return nil
}

// Leave has the connection move off node, a server found hanging: every channel is
// subscribed on another, and every watcher reads its stream.
func (h *Hub[E]) Leave(node string) {
	h.mu.Lock()
	move := h.cfg.Node != nil && h.c.ps != nil && (h.c.node == node || h.c.node == "")
	h.c.leave = h.c.leave || move
	h.mu.Unlock()
	if move {
		h.kick()
	}
}

// Node names the connection's server ("" if go-redis chose it, or none is open).
func (h *Hub[E]) Node() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.c.node
}

// connect returns the connection, opened (outside h.mu: Config.Node may ask Redis) when
// there is none or it is to leave its server. A new one subscribes every channel at once;
// until it delivers, the hub is down and every watcher reads its stream.
func (h *Hub[E]) connect() (ps *redis.PubSub, node string, opened bool) {
	h.mu.Lock()
	ps, node, leave := h.c.ps, h.c.node, h.c.leave
	h.mu.Unlock()
	if ps != nil && !leave {
		return ps, node, false
	}
	client := h.cfg.Redis
	if h.cfg.Node != nil {
		client, node = h.cfg.Node(node)
	}
	ps, now := client.Subscribe(h.cfg.Ctx), time.Now()
	h.mu.Lock()
	old := h.c.ps
	h.c.ps, h.c.node, h.c.leave = ps, node, false
	close(h.c.opened)
	h.c.opened = make(chan struct{})
	for ch := range h.subscribed {
		p, ok := h.pending[ch]
		if !ok {
			p.since = now
		}
		p.sent = time.Time{} // due now
		h.pending[ch] = p
	}
	h.mu.Unlock()
	if old != nil {
		_ = old.Close()
		h.down.Store(true)
		h.all((*Watch[E]).mustRead)
	}
	return ps, node, true
}

// send subscribes and unsubscribes channels, one command each. It alone sends them, so a
// channel's subscription and unsubscription reach Redis in the order they were decided.
func (h *Hub[E]) send() {
	ctx := h.cfg.Ctx
	defer h.cfg.WG.Done()
	defer func() {
		h.mu.Lock()
		ps := h.c.ps
		h.mu.Unlock()
		if ps != nil {
			_ = ps.Close()
		}
	}()
	timer := time.NewTimer(time.Hour) // armed while channels are idle or unconfirmed
	timer.Stop()
	var pinged time.Time // a PING unanswered on the connection; zero: none
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-h.flush:
		case <-timer.C:
		}
		ps, node, opened := h.connect()
		if opened {
			pinged = time.Time{}
		}
		h.mu.Lock()
		sent := h.sent
		join, leave, next := h.plan(time.Now())
		watched := len(h.watches) > 0
		h.mu.Unlock()
		if h.cfg.Node != nil && watched {
			if pinged = h.ping(ps, node, pinged); next.IsZero() || pinged.Add(ConfirmWithin).Before(next) {
				next = pinged.Add(ConfirmWithin)
			}
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		if len(join) > 0 && !h.subscribe(ps, join, sent) {
			timer.Reset(poll.Every)
		}
		if len(leave) > 0 {
			_ = ps.Unsubscribe(ctx, leave...)
		}
	}
}

// subscribe sends SUBSCRIBE for join; false if it failed.
func (h *Hub[E]) subscribe(ps *redis.PubSub, join []string, sent func([]string, error)) bool {
	err := ps.Subscribe(h.cfg.Ctx, join...)
	if sent != nil {
		sent(join, err)
	}
	if err == nil {
		return true
	}
	// go-redis may have reconnected inside it without these channels: send them again
	// soon, whatever it says (a new connection sends them at once).
	h.mu.Lock()
	if h.c.ps == ps {
		for _, ch := range join {
			if p, ok := h.pending[ch]; ok {
				p.sent = time.Now().Add(poll.Every - ConfirmWithin)
				h.pending[ch] = p
			}
		}
	}
	h.mu.Unlock()
	return false
}

// ping checks, while followers wait on it, that the connection delivers: a PING each
// ConfirmWithin, answered once anything is read after it. One left unanswered is told to
// Config.Unanswered, and the connection moves. It returns when the PING under way was sent.
func (h *Hub[E]) ping(ps *redis.PubSub, node string, pinged time.Time) time.Time {
	now := time.Now()
	switch {
	case !pinged.IsZero() && h.heard.Load() >= int64(pinged.Sub(hubEpoch)):
		if now.Sub(pinged) < ConfirmWithin {
			return pinged
		}
	case !pinged.IsZero() && now.Sub(pinged) < ConfirmWithin:
		return pinged
	case !pinged.IsZero():
		if h.cfg.Unanswered != nil && node != "" {
			h.cfg.Unanswered(node)
		}
		h.mu.Lock()
		h.c.leave = true
		h.mu.Unlock()
		h.kick()
		return now
	}
	_ = ps.Ping(h.cfg.Ctx)
	return now
}

// receive routes what the connection brings to the channel's listener or watchers.
func (h *Hub[E]) receive() {
	ctx := h.cfg.Ctx
	defer h.cfg.WG.Done()
	backoff := 10 * time.Millisecond
	for {
		h.mu.Lock()
		ps, opened := h.c.ps, h.c.opened
		h.mu.Unlock()
		if ps == nil {
			select {
			case <-opened:
				continue
			case <-ctx.Done():
				return
			}
		}
		v, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !h.failed(ps, err) {
				continue // replaced meanwhile: the new connection is read
			}
			// go-redis reconnects on the next Receive; back off, not a busy loop.
			if !poll.Sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		h.heard.Store(int64(time.Since(hubEpoch)))
		h.down.Store(false)
		h.route(v)
	}
}

// failed acts on ps's failure, false if ps was replaced meanwhile. Messages may have been
// lost: every follower reads its stream. Where Config.Node chooses, the sender opens a new
// connection, off the server that failed.
func (h *Hub[E]) failed(ps *redis.PubSub, err error) bool {
	h.mu.Lock()
	if h.c.ps != ps {
		h.mu.Unlock()
		return false
	}
	move := h.cfg.Node != nil
	h.c.leave = h.c.leave || move
	h.mu.Unlock()
	if h.cfg.Failed != nil {
		h.cfg.Failed(err)
	}
	h.down.Store(true)
	h.unconfirm()
	h.all((*Watch[E]).mustRead)
	return true
}

// route hands one thing read to its listener or watchers.
func (h *Hub[E]) route(v any) {
	switch m := v.(type) {
	case *redis.Subscription:
		if m.Kind != "subscribe" {
			return
		}
		h.mu.Lock()
		delete(h.pending, m.Channel)
		h.mu.Unlock()
		if l, ok := h.listenerOf(m.Channel); ok {
			l.Confirmed()
			return
		}
		h.each(m.Channel, (*Watch[E]).mustRead)
	case *redis.Message:
		if l, ok := h.listenerOf(m.Channel); ok {
			l.Message(m.Payload)
			return
		}
		if strings.HasPrefix(m.Channel, h.cfg.AlivePrefix) {
			h.Heard(m.Channel, strings.Fields(m.Payload))
			return
		}
		if !h.Watched(m.Channel) {
			return // an idle channel, still subscribed (see Config.KeepIdle)
		}
		e, ok := h.cfg.Decode(m.Payload)
		if !ok {
			h.each(m.Channel, (*Watch[E]).mustRead)
			return
		}
		h.each(m.Channel, func(w *Watch[E]) { w.mu.Lock(); w.queue = append(w.queue, e); w.mu.Unlock() })
	}
}
