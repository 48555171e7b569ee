package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/clusterclient"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
	"github.com/redis/go-redis/v9"
)

// config is what a run is made of, before any client asks.
type config struct {
	seed      int64
	instances int
	masters   int                  // Redis Cluster masters; 0: one standalone server; -1: no Redis
	opts      singleflight.Options // each instance's, before the seams the world sets
	latency   time.Duration        // one way, instance to Redis; if zero, 100µs
	keys      map[string]keySpec
	plans     func(key string, n int) plan
	// verbose chooses the Redis commands the timeline shows; nil shows none.
	verbose func(name, reply string) bool
	// progress, if set, counts events and bytes moved, for a watchdog outside the bubble.
	progress *atomic.Int64
}

type keySpec struct {
	stream bool
}

// optsResultTTL is the options of a run that stores answers for ttl (negative: none).
func optsResultTTL(ttl time.Duration) singleflight.Options {
	return singleflight.Options{ResultTTL: ttl}
}

// defaults are the production defaults (config.example.yaml) where a run sets nothing.
func (c *config) defaults() {
	if c.instances == 0 {
		c.instances = 2
	}
	if c.latency == 0 {
		c.latency = 100 * time.Microsecond
	}
	if c.opts.ResultTTL == 0 {
		c.opts.ResultTTL = 10 * time.Minute
	}
	if c.plans == nil {
		c.plans = func(string, int) plan { return plan{chunks: 5, gap: 200 * time.Millisecond} }
	}
	o := &c.opts
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.HeartbeatInterval, time.Second)
	def(&o.LeaseTTL, 3*time.Second)
	def(&o.TakeoverJitter, 500*time.Millisecond)
	def(&o.Linger, 30*time.Second)
	def(&o.Timeout, 10*time.Minute)
	def(&o.RedisTimeout, time.Second)
	def(&o.AbandonGrace, 2*time.Second)
}

// world is one simulated deployment in one synctest bubble: Redis, instances, the
// upstream and the clients, and the history of all they did.
type world struct {
	t     testing.TB
	cfg   config
	keys  map[string]keySpec
	start time.Time
	ctx   context.Context // ends when the run ends: scheduled faults and clients stop
	stop  context.CancelFunc
	hist  *history
	stats stats

	nodes []*node // every Redis server, by address
	cl    *cluster
	links sync.Map // linkKey → *link
	insts []*instance
	up    *upstream

	mu      sync.Mutex
	rng     *rnd
	clients []*client
	faults  []fault
	acks    []ack
	refused map[int]time.Duration // calls whose answer's final write Redis refused, and when
	wg      sync.WaitGroup        // clients and scheduled events
	viol    []string
	ended   time.Duration // when the run ended
}

type linkKey struct{ inst, addr string }

func newWorld(t testing.TB, cfg config) *world {
	cfg.defaults()
	w := &world{t: t, cfg: cfg, keys: cfg.keys, start: time.Now(), rng: newRnd(cfg.seed)}
	w.ctx, w.stop = context.WithCancel(context.Background())
	if cfg.progress == nil {
		cfg.progress = new(atomic.Int64)
		w.cfg.progress = cfg.progress
	}
	w.hist = &history{start: w.start, progress: cfg.progress}
	w.up = &upstream{w: w, plans: cfg.plans}
	switch {
	case cfg.masters > 0:
		var addrs []string
		for i := range cfg.masters {
			addrs = append(addrs, fmt.Sprintf("10.0.0.%d:6379", i+1))
		}
		w.cl = newCluster(addrs)
		w.nodes = w.cl.nodes
		go w.cl.bus.run()
	case cfg.masters == 0:
		w.nodes = []*node{newNode("10.0.0.1:6379")}
	}
	for _, n := range w.nodes {
		n.lost = func(channel string) { w.lostMessage(n, channel) }
	}
	for i := range cfg.instances {
		w.insts = append(w.insts, w.newInstance(string(rune('A'+i))))
	}
	// The run starts once every instance has started: what they did to start is not in it.
	w.start = time.Now()
	w.hist.reset(w.start)
	w.stats.reset()
	return w
}

func (w *world) now() time.Duration { return time.Since(w.start) }

// link is the path from inst to addr, made on first use.
func (w *world) link(inst, addr string) *link {
	l, _ := w.links.LoadOrStore(linkKey{inst, addr}, newLink(inst, addr, w.cfg.progress))
	return l.(*link)
}

func (w *world) node(addr string) *node {
	for _, n := range w.nodes {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

// instance is one proxy process: a real Group with a real go-redis client.
type instance struct {
	w        *world
	id       string
	g        *singleflight.Group
	rdb      redis.UniversalClient
	dead     atomic.Bool // killed: it does nothing more
	draining atomic.Bool // shutting down: the balancer sends it no new client

	mu     sync.Mutex
	paused chan struct{} // non-nil while paused: closed at resume
	pauses int           // pauses in force (they may overlap)
	killed chan struct{} // closed when killed
	closed bool
}

var errKilled = errors.New("the process was killed")

func (w *world) newInstance(id string) *instance {
	in := &instance{w: w, id: id, killed: make(chan struct{})}
	o := w.cfg.opts
	o.InstanceID = id
	o.Observer = observer{h: w.hist, inst: in}
	// Each instance draws its own jitter, so that a run's draws do not depend on the order
	// in which instances drew.
	var jmu sync.Mutex
	jr := newRnd(w.cfg.seed*31 + int64(id[0]))
	o.Jitter = func(max time.Duration) time.Duration {
		jmu.Lock()
		defer jmu.Unlock()
		return time.Duration(jr.Int64N(int64(max))).Round(time.Millisecond)
	}
	if len(w.nodes) > 0 {
		var addrs []string
		for _, n := range w.nodes {
			addrs = append(addrs, n.addr)
		}
		// As cmd/llm-dedupe-proxy's newRedis makes it, over the simulated network.
		uo := &redis.UniversalOptions{
			Addrs:                 addrs,
			DialTimeout:           time.Second,
			ReadTimeout:           o.RedisTimeout,
			WriteTimeout:          o.RedisTimeout,
			ContextTimeoutEnabled: true,
			MaxRetries:            2,
			DialerRetries:         1,
			Dialer: func(ctx context.Context, _, addr string) (net.Conn, error) {
				n := w.node(addr)
				if n == nil {
					return nil, errRefused
				}
				w.stats.dial(addr)
				return dial(w.link(id, addr), w.cfg.latency, n.serve, nil)
			},
		}
		if w.cl != nil {
			in.rdb = clusterclient.New(uo.Cluster())
		} else {
			in.rdb = redis.NewUniversalClient(uo)
		}
		in.rdb.AddHook(recorder{inst: in})
		o.Redis = in.rdb
	}
	in.g = singleflight.New(o)
	if in.rdb != nil {
		// As cmd/llm-dedupe-proxy does at start: a Cluster's layout and command table are
		// loaded before the first request.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = in.g.Check(ctx)
		cancel()
	}
	return in
}

// gate returns at once, or when a paused instance resumes; false if it was killed.
func (in *instance) gate() bool {
	for {
		in.mu.Lock()
		p := in.paused
		in.mu.Unlock()
		if p == nil {
			return !in.dead.Load()
		}
		select {
		case <-p:
		case <-in.killed:
			return false
		}
	}
}

// sleep waits d of the instance's time: a pause stops it, a kill ends it.
func (in *instance) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-in.killed:
		return errKilled
	}
	if !in.gate() {
		return errKilled
	}
	return ctx.Err()
}

// clientSpec is what one client asks, and how it behaves.
type clientSpec struct {
	at      time.Duration // when it asks
	on      string        // the instance the balancer sends it to (another if that one died)
	key     string
	noCache bool
	noStore bool
	finish  bool
	// leave > 0: the client gives up this long after asking, answered or not.
	leave time.Duration
	// leaveAtFirst: the client leaves as soon as it has its first bytes.
	leaveAtFirst bool
}

// client is one request and what it got.
type client struct {
	clientSpec
	id   int
	inst *instance

	// Written by its goroutine; read once the run is over.
	asked, first, done time.Duration
	role               singleflight.Role
	status             int
	body               []byte
	err                error
	left, lost         bool // it gave up; its instance was killed under it
	refused            bool // the instance was closed

	mu     sync.Mutex    // body and leftAt, shared with the leave timer
	leftAt time.Duration // when it gave up
}

func (c *client) String() string { return fmt.Sprintf("c%d", c.id) }

// ask schedules a client.
func (w *world) ask(s clientSpec) *client {
	w.mu.Lock()
	c := &client{clientSpec: s, id: len(w.clients) + 1}
	w.clients = append(w.clients, c)
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if !w.sleepUntil(s.at) {
			return
		}
		w.runClient(c)
	}()
	return c
}

// sleepUntil waits until virtual time at; false when the run ended first.
func (w *world) sleepUntil(at time.Duration) bool {
	t := time.NewTimer(at - w.now())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.ctx.Done():
		return false
	}
}

func (w *world) instance(id string) *instance {
	for _, in := range w.insts {
		if in.id == id {
			return in
		}
	}
	panic("no instance " + id)
}

func (w *world) runClient(c *client) {
	c.inst = w.instance(c.on)
	if c.inst.dead.Load() || c.inst.draining.Load() {
		// The balancer sends it to an instance that serves.
		for _, in := range w.insts {
			if !in.dead.Load() && !in.draining.Load() {
				c.inst = in
				break
			}
		}
	}
	in := c.inst
	if in.dead.Load() || !in.gate() {
		c.lost = true // no instance serves: nobody asked
		return
	}
	c.asked = w.now()
	mode := "unary"
	if w.keys[c.key].stream {
		mode = "stream"
	}
	w.hist.add(in.id, kClient, "", "%s: %s asks (%s%s)", c.key, c, mode, c.flags())
	ctx, cancel := context.WithCancelCause(w.ctx)
	defer cancel(nil)
	if c.leave > 0 {
		t := time.AfterFunc(c.leave, func() {
			c.leaving(w)
			cancel(errLeft)
		})
		defer t.Stop()
	}
	stopKill := context.AfterFunc(killCtx(in), func() { cancel(errKilled) })
	defer stopKill()
	rd, err := in.g.DoWith(c.key, singleflight.CallOptions{NoCache: c.noCache, Finish: c.finish, Context: ctx,
		Inline: !w.keys[c.key].stream, Route: "/v1/chat/completions"}, w.up.fn(c))
	if err != nil {
		c.refused, c.err, c.done = true, err, w.now()
		w.hist.add(in.id, kClient, "", "%s: %s refused: %v", c.key, c, err)
		return
	}
	c.read(ctx, rd)
	rd.Close()
}

var errLeft = errors.New("the client gave up")

// leaving records that c gave up, at the moment it does: an Inline starter's DoWith may
// return only once its flight ends.
func (c *client) leaving(w *world) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leftAt == 0 {
		c.leftAt = w.now()
		w.hist.add(c.inst.id, kClient, "", "%s: %s leaves, having %s", c.key, c, c.bodyWordLocked())
	}
}

func killCtx(in *instance) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-in.killed:
		case <-in.w.ctx.Done():
		}
		cancel()
	}()
	return ctx
}

// read takes the client's answer until its end, an error, or its leaving.
func (c *client) read(ctx context.Context, rd *singleflight.Reader) {
	w := c.inst.w
	for {
		b, err := rd.Next(ctx)
		if !c.inst.gate() {
			err = errKilled
		}
		if err == nil && len(b) > 0 {
			if c.first == 0 {
				c.first = w.now()
				c.role, c.status = rd.Role(), rd.Head().Status
			}
			c.mu.Lock()
			c.body = append(c.body, b...)
			c.mu.Unlock()
			if !c.leaveAtFirst {
				continue
			}
			c.leaving(w)
			err = errLeft
		}
		c.done = w.now()
		if c.role == singleflight.RoleUnknown {
			c.role, c.status = rd.Role(), rd.Head().Status
		}
		switch {
		case errors.Is(err, io.EOF):
			w.hist.add(c.inst.id, kClient, "", "%s: %s answered: %s %d, %s", c.key, c, c.role, c.status, c.bodyWord())
		case errors.Is(err, errLeft) || errors.Is(context.Cause(ctx), errLeft):
			c.left, c.done = true, c.leftAt
		case errors.Is(err, errKilled) || errors.Is(context.Cause(ctx), errKilled):
			c.lost = true
		default:
			c.err = err
			w.hist.add(c.inst.id, kClient, "", "%s: %s gets an error: %s, having %s", c.key, c, errName(err), c.bodyWord())
		}
		return
	}
}

func (c *client) flags() string {
	var f []string
	for _, x := range []struct {
		on   bool
		name string
	}{{c.noCache, "no-cache"}, {c.noStore, "no-store"}, {c.finish, "finish"}} {
		if x.on {
			f = append(f, x.name)
		}
	}
	if c.leave > 0 {
		f = append(f, "leaves after "+c.leave.String())
	}
	if c.leaveAtFirst {
		f = append(f, "leaves at its first bytes")
	}
	if len(f) == 0 {
		return ""
	}
	return ", " + strings.Join(f, ", ")
}

// bodyWord says which call a client's bytes came from, and how many chunks of it.
func (c *client) bodyWord() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bodyWordLocked()
}

func (c *client) bodyWordLocked() string {
	if len(c.body) == 0 {
		return "nothing"
	}
	parts := strings.Split(strings.TrimSuffix(string(c.body), ";"), ";")
	calls := map[string]int{}
	var order, failures []string
	for _, p := range parts {
		f := strings.Split(p, ".")
		if len(f) < 3 {
			return fmt.Sprintf("%q", c.body)
		}
		if _, err := strconv.Atoi(f[2]); err != nil { // a failed answer's body: what failed
			what := map[string]string{"fail": "failure"}[f[2]]
			if what == "" {
				what = f[2]
			}
			failures = append(failures, fmt.Sprintf("call %s's %s", f[1], what))
			continue
		}
		if calls[f[1]] == 0 {
			order = append(order, f[1])
		}
		calls[f[1]]++
	}
	var s []string
	for _, n := range order {
		s = append(s, fmt.Sprintf("%d chunks of call %s", calls[n], n))
	}
	return strings.Join(append(s, failures...), " + ")
}

func errName(err error) string {
	for _, e := range []error{singleflight.ErrGenerationChanged, singleflight.ErrFailed, singleflight.ErrClosed,
		singleflight.ErrShutdown, singleflight.ErrAbandoned} {
		if errors.Is(err, e) {
			return strings.TrimPrefix(e.Error(), "singleflight: ")
		}
	}
	return err.Error()
}

// at runs fn at virtual time d, unless the run has ended.
func (w *world) at(d time.Duration, fn func()) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if w.sleepUntil(d) {
			fn()
		}
	}()
}

// run waits for every client and scheduled event, lets the world settle for settle, then
// closes every instance and server and checks the invariants.
func (w *world) run(settle time.Duration) {
	w.wg.Wait()
	time.Sleep(settle)
	w.end()
}

// end closes the world: instances first (their owned flights released), then Redis.
func (w *world) end() {
	w.mu.Lock()
	w.ended = w.now()
	w.mu.Unlock()
	w.stop()
	w.checkExpiry()
	for _, in := range w.insts {
		in.close(time.Second)
	}
	for _, n := range w.nodes {
		n.stop()
	}
	if w.cl != nil {
		w.cl.bus.stop()
	}
	// A closed go-redis pool's redial of a server that refused it sleeps out its second.
	time.Sleep(2 * time.Second)
	w.check()
}

func (in *instance) close(grace time.Duration) {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return
	}
	in.closed = true
	if in.paused != nil {
		close(in.paused)
		in.paused = nil
	}
	in.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = in.g.Close(ctx)
	if in.rdb != nil {
		_ = in.rdb.Close()
	}
}

// rnd is the run's seeded source.
type rnd struct{ *rand.Rand }

func newRnd(seed int64) *rnd { return &rnd{rand.New(rand.NewPCG(uint64(seed), 0x5eed))} }

// between draws a duration in [lo, hi).
func (r *rnd) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return (lo + time.Duration(r.Int64N(int64(hi-lo)))).Round(time.Millisecond)
}

// sortedKeys lists a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// stats counts what instances asked of Redis: commands by name, and dials by address.
type stats struct {
	mu       sync.Mutex
	commands map[string]int
	dials    map[string]int
}

func (s *stats) reset() {
	s.mu.Lock()
	s.commands, s.dials = nil, nil
	s.mu.Unlock()
}

func (s *stats) command(name string) {
	s.mu.Lock()
	if s.commands == nil {
		s.commands = map[string]int{}
	}
	s.commands[name]++
	s.mu.Unlock()
}

func (s *stats) dial(addr string) {
	s.mu.Lock()
	if s.dials == nil {
		s.dials = map[string]int{}
	}
	s.dials[addr]++
	s.mu.Unlock()
}
