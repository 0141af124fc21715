package zmq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/lograte"
	"github.com/kvindex/kvindex/internal/tick"
)

// ErrFrames reports a ZMQ message that is not vLLM's [topic, seq, payload].
var ErrFrames = errors.New("events: malformed message frames")

// Endpoint is one engine PUB socket the subscriber connects to (pull mode).
type Endpoint struct {
	Worker events.WorkerRef
	// Address is the ZMQ endpoint, e.g. tcp://10.0.0.5:5557.
	Address string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
	// ReplayEndpoint is the engine's replay ROUTER socket ("" for none): gaps
	// are filled from it, and on start it is asked for every buffered batch.
	ReplayEndpoint string
	// Sink receives the worker's batches in seq order.
	Sink events.Sink
	// Resume says the sink holds the engine's batches up to seq ResumeAfter
	// (an agent restored from its checkpoint): once connected the stream
	// asks the replay socket for what came since.
	Resume      bool
	ResumeAfter uint64
}

// PushListener is the bound SUB sockets many engines connect to (push
// mode). Engines are told apart by topic (Routes, then llm-d's
// "kv@<pod>@<model>"), DP ranks by port: vLLM offsets a connecting
// endpoint's port by the rank (events.OffsetEndpoint), so the listener
// binds Address and the DPSize-1 ports after it, port+r being rank r's. The
// port, not the payload, says the rank: it tells one publisher (one seq
// stream) from another, so a data_parallel_rank that disagrees is refused
// (dp_rank_mismatch), not mixed into the port's worker. With DPSize 1 the
// payload's rank decides (0 without one), for publishers that send every
// rank to one address, which vLLM never does.
//
// It is fenced by pod name: it reaches only workers it created, for their
// topic's model, never a pull-mode pod or one another listener routes or
// claimed; a routed pod only through its routes. Refusals are counted by
// reason (Subscriber.Refusals).
type PushListener struct {
	// Address is where to bind, e.g. tcp://*:5557.
	Address string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
	// Routes maps exact topics to pods.
	Routes map[string]events.TopicRoute
	// MaxWorkers bounds the workers (pod, rank) the listener creates; 0 means
	// DefaultPushMaxWorkers.
	MaxWorkers int
	// Allow, when not empty, lists the IPs or CIDRs engines may connect
	// from; others are refused at the handshake (ZAP) and counted.
	Allow []string
	// DPSize is the largest data-parallel size of the engines that connect,
	// the ports bound from Address on; 0 means 1. At most MaxDPRank.
	DPSize int
}

// DefaultPushMaxWorkers is PushListener.MaxWorkers's default.
const DefaultPushMaxWorkers = 32

// MaxDPRank bounds the data_parallel_rank of a push message.
const MaxDPRank = 1024

// NewWorkerFunc creates the events.Sink of a worker first seen on a push listener.
type NewWorkerFunc func(ref events.WorkerRef, model, replayEndpoint string) (events.Sink, error)

// Defaults of SubscriberOptions that a daemon's configuration exposes.
const (
	// DefaultReplayTimeout bounds one replay exchange: vLLM serves replay
	// between queue reads, up to ~100 ms late.
	DefaultReplayTimeout        = 3 * time.Second
	DefaultReplayConcurrency    = 4
	DefaultStaleAfterDisconnect = 5 * time.Second
	DefaultQueueSize            = 4096
	// DefaultMaxMessageBytes is twice a 1 M-token prompt's batch (~7 MB).
	DefaultMaxMessageBytes = 16 << 20
	// DefaultQueueBytes, with the message bound, caps what one slow worker pins.
	DefaultQueueBytes     = 64 << 20
	DefaultReplayMaxBytes = 256 << 20
)

// SubscriberOptions tune a Subscriber. The zero value is usable.
type SubscriberOptions struct {
	// Logger receives problem reports; nil discards them.
	Logger *slog.Logger
	// PollInterval bounds a receive loop's wait before it checks for
	// shutdown; 0 means 100 ms.
	PollInterval time.Duration
	// ReconnectInterval and ReconnectMax set libzmq's reconnect backoff;
	// 0 means 100 ms and 5 s.
	ReconnectInterval, ReconnectMax time.Duration
	// RcvHWM is the SUB socket's receive high-water mark; 0 means 100,000,
	// vLLM's send HWM.
	RcvHWM int
	// LogEvery rate-limits repeated problem logs per worker (then one line
	// per interval with the number suppressed); 0 means one minute.
	LogEvery time.Duration
	// QueueSize is each worker's queue of decoded batches; a full queue
	// drops and counts the message, and the seq gap recovers it. 0 means 4,096.
	QueueSize int
	// QueueBytes bounds the payload bytes in one worker's queue, and
	// separately of the live batches held while a replay runs; past it
	// messages are dropped as for a full queue. 0 means DefaultQueueBytes.
	QueueBytes int64
	// MaxMessageBytes is ZMQ_MAXMSGSIZE; 0 means DefaultMaxMessageBytes,
	// negative no limit.
	MaxMessageBytes int64

	// Push lists bound SUB sockets for push-mode engines.
	Push []PushListener
	// NewWorker creates a push-mode worker's sink; required with Push.
	NewWorker NewWorkerFunc
	// Applied, when set, is called on the worker's goroutine after each batch
	// was handed to its sink, e.g. to measure lag (metrics.Lag). b is valid
	// only during the call, and the next batch waits for it.
	Applied func(ref events.WorkerRef, b *events.Batch, replayed bool)

	// ReplayTimeout bounds one replay exchange; 0 means 3 s.
	ReplayTimeout time.Duration
	// ReplayIdle ends a started answer paused this long without its end
	// marker (the engine dropped the rest at its send HWM); the rest is asked
	// again. 0 means 250 ms.
	ReplayIdle time.Duration
	// ReplayConcurrency bounds replays in flight; 0 means 4.
	ReplayConcurrency int
	// ReplayMaxBatches bounds one replay's size; 0 means 100,000.
	ReplayMaxBatches int
	// ReplayMaxBytes bounds the payload bytes one answer collects before it
	// is applied and the rest asked for; 0 means DefaultReplayMaxBytes.
	ReplayMaxBytes int64
	// ReplayBackoff is the first wait after a failed replay (doubling to
	// 30 s); gaps meanwhile go to the GapPolicy. 0 means 1 s.
	ReplayBackoff time.Duration
	// ReplayRetries is how many times a failed replay is asked again, each
	// after the backoff, before its gap goes to the GapPolicy; the live
	// batches wait meanwhile (MaxPending). 0 means 2; negative, none.
	ReplayRetries int
	// MaxPending bounds live batches held while a replay runs; 0 means 10,000.
	MaxPending int
	// GapPolicy is what an unfillable gap does to the worker's blocks.
	GapPolicy events.GapPolicy

	// StaleAfterDisconnect marks a pull-mode worker stale after this long
	// without a connection; 0 means 5 s, negative disables.
	StaleAfterDisconnect time.Duration
	// ConflictQuiet is how long one of two interleaving publishers must be
	// silent for the worker to follow the other; 0 means 10 s.
	ConflictQuiet time.Duration
	// StaleAfterSilence marks a worker stale after sending nothing this
	// long; 0 disables it (vLLM is silent while idle).
	StaleAfterSilence time.Duration
	// Tiers maps medium names to the class the index holds blocks in,
	// applied to every batch before its sink (events.Tiers.Classify); nil
	// is the built-in table, unknown names in MediumOther.
	Tiers *events.Tiers
}

func (o *SubscriberOptions) defaults() {
	defaults.Zero(&o.Logger, slog.New(slog.DiscardHandler))
	defaults.Zero(&o.PollInterval, 100*time.Millisecond)
	defaults.Zero(&o.ReconnectInterval, 100*time.Millisecond)
	defaults.Zero(&o.ReconnectMax, 5*time.Second)
	defaults.Zero(&o.LogEvery, time.Minute)
	defaults.Zero(&o.ReplayTimeout, DefaultReplayTimeout)
	defaults.Zero(&o.ReplayIdle, 250*time.Millisecond)
	defaults.Zero(&o.ConflictQuiet, 10*time.Second)
	defaults.Zero(&o.ReplayBackoff, time.Second)
	defaults.Zero(&o.ReplayRetries, 2)
	defaults.Zero(&o.StaleAfterDisconnect, DefaultStaleAfterDisconnect)
	defaults.Positive(&o.RcvHWM, 100_000)
	defaults.Positive(&o.QueueSize, DefaultQueueSize)
	defaults.Positive(&o.ReplayConcurrency, DefaultReplayConcurrency)
	defaults.Positive(&o.ReplayMaxBatches, 100_000)
	defaults.Positive(&o.MaxPending, 10_000)
	defaults.Zero(&o.QueueBytes, DefaultQueueBytes)
	defaults.Zero(&o.MaxMessageBytes, DefaultMaxMessageBytes)
	defaults.Zero(&o.ReplayMaxBytes, DefaultReplayMaxBytes)
}

// Subscriber receives vLLM KV events over ZMQ SUB sockets, pull mode, push
// mode or both. Each worker's stream tracks seq, fills gaps by replay,
// applies the gap policy and hands batches to the worker's events.Sink; a
// health checker marks workers stale. It implements events.StatsSource and
// events.HealthSource; goroutines are as in the package doc, and streams are
// registered under mu.
type Subscriber struct {
	opts SubscriberOptions

	zctx        *zmq4.Context
	replaySlots chan struct{}
	batches     sync.Pool // *events.Batch
	refusals    pushRefusals

	monitors atomic.Int64 // numbers the monitor sockets' inproc addresses

	// routedPods is the listener whose Routes name each routed pod, and
	// pushAddrs each listener's bound addresses by DP rank (read-only after
	// NewSubscriber).
	routedPods map[string]int
	pushAddrs  [][]string

	mu          sync.RWMutex // guards streams, byRef, runCtx, pushWorkers, pushPods, pullPods, added, stopped
	pushWorkers []int        // workers created by each push listener
	// pushPods are the pods push listeners claimed by their first worker:
	// other ranks must come from the same listener for the same model.
	pushPods map[string]podClaim
	pullPods map[string]bool // pods of pull-mode endpoints
	streams  []*stream
	byRef    map[events.WorkerRef]*stream
	added    map[events.WorkerRef]*added // running pull-mode endpoints
	runCtx   context.Context
	stopped  bool // Run returned
	wg       sync.WaitGroup
}

// podClaim is the listener and model that own a push-mode pod name.
type podClaim struct {
	listener int
	model    string
}

// NewSubscriber checks the endpoints and options; nothing connects until Run.
func NewSubscriber(opts SubscriberOptions, eps ...Endpoint) (*Subscriber, error) {
	opts.defaults()
	s := &Subscriber{opts: opts, byRef: make(map[events.WorkerRef]*stream), added: make(map[events.WorkerRef]*added),
		pullPods: map[string]bool{}, routedPods: map[string]int{}, pushPods: map[string]podClaim{}}
	s.batches.New = func() any { return new(events.Batch) }
	for i, ep := range eps {
		if err := s.AddEndpoint(ep); err != nil {
			return nil, fmt.Errorf("%w (endpoint %d)", err, i)
		}
	}
	s.opts.Push = slices.Clone(opts.Push) // MaxWorkers and DPSize defaults are filled in below
	s.refusals.counts = make([][numRefusals]atomic.Int64, len(opts.Push))
	s.refusals.logs = make([][numRefusals]lograte.Limiter, len(opts.Push))
	s.pushWorkers = make([]int, len(opts.Push))
	s.pushAddrs = make([][]string, len(opts.Push))
	for i, pl := range opts.Push {
		defaults.Positive(&s.opts.Push[i].MaxWorkers, DefaultPushMaxWorkers)
		defaults.Positive(&s.opts.Push[i].DPSize, 1)
		switch {
		case pl.Address == "":
			return nil, fmt.Errorf("events: push listener %d: empty address", i)
		case opts.NewWorker == nil:
			return nil, fmt.Errorf("events: push listener %s: NewWorker is required", pl.Address)
		case pl.DPSize < 0 || pl.DPSize > MaxDPRank:
			return nil, fmt.Errorf("events: push listener %s: DPSize %d outside [0, %d]", pl.Address, pl.DPSize, MaxDPRank)
		}
		for r := range s.opts.Push[i].DPSize {
			addr, err := events.OffsetEndpoint(pl.Address, r)
			if err != nil {
				return nil, fmt.Errorf("events: push listener %s: DPSize %d: %w", pl.Address, pl.DPSize, err)
			}
			s.pushAddrs[i] = append(s.pushAddrs[i], addr)
		}
		for _, topic := range slices.Sorted(maps.Keys(pl.Routes)) {
			pod := pl.Routes[topic].Pod
			if s.pullPods[pod] {
				return nil, fmt.Errorf("events: push listener %s: route %q: pod %q is a pull-mode pod", pl.Address, topic, pod)
			}
			if li, ok := s.routedPods[pod]; ok && li != i {
				return nil, fmt.Errorf("events: push listener %s: route %q: pod %q is routed on push listener %s too", pl.Address, topic, pod, opts.Push[li].Address)
			}
			s.routedPods[pod] = i
		}
	}
	return s, nil
}

// Run connects and binds every socket and receives until ctx is done; it
// returns nil after a clean shutdown, or the first error that stopped it.
func (s *Subscriber) Run(ctx context.Context) error {
	zctx, err := zmq4.NewContext()
	if err != nil {
		return fmt.Errorf("events: create zmq context: %w", err)
	}
	s.zctx = zctx
	s.replaySlots = make(chan struct{}, s.opts.ReplayConcurrency)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	if s.runCtx != nil || s.stopped {
		s.mu.Unlock()
		return errors.New("events: subscriber run twice")
	}
	s.runCtx = ctx
	errc := make(chan error, len(s.streams)+len(s.opts.Push))
	fail := func(err error) {
		errc <- err
		cancel()
	}
	for _, st := range s.streams { // only pull-mode streams exist before Run
		if err := s.startPull(ctx, st, fail); err != nil {
			fail(err)
			break
		}
	}
	s.mu.Unlock()
	s.bindPush(ctx, fail)
	s.goTracked(nil, func() { s.checkHealth(ctx) })
	<-ctx.Done()
	s.mu.Lock()
	s.stopped = true // no AddEndpoint starts goroutines past this point
	s.mu.Unlock()
	s.wg.Wait()
	zctx.Term()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// bindPush binds every push listener's sockets, one per DP rank, and
// starts their receive loops; the first failure goes to fail.
func (s *Subscriber) bindPush(ctx context.Context, fail func(error)) {
	for i, addrs := range s.pushAddrs {
		for rank, addr := range addrs {
			if ctx.Err() != nil {
				return
			}
			sock, mon, err := s.bind(i, addr)
			if err != nil {
				fail(err)
				return
			}
			r := &receiver{sub: s, pl: &s.opts.Push[i], pli: i, addr: addr, rank: rank}
			if len(addrs) == 1 {
				r.rank = -1 // one address for every rank: the payload's rank decides
			}
			s.goTracked(nil, func() {
				if err := s.receive(ctx, sock, mon, r); err != nil {
					fail(err)
				}
			})
		}
	}
}

// goTracked runs f on a goroutine that s.wg, and a.wg when a is not nil,
// wait for. Callers that pass an a hold s.mu (RemoveEndpoint waits on it).
func (s *Subscriber) goTracked(a *added, f func()) {
	s.wg.Add(1)
	if a != nil {
		a.wg.Add(1)
	}
	go func() {
		defer s.wg.Done()
		if a != nil {
			defer a.wg.Done()
		}
		f()
	}()
}

func (s *Subscriber) setSockopts(sock *zmq4.Socket, topic string) error {
	for _, set := range []func() error{
		func() error { return sock.SetLinger(0) },
		func() error { return sock.SetRcvhwm(s.opts.RcvHWM) },
		func() error { return sock.SetMaxmsgsize(max(s.opts.MaxMessageBytes, -1)) },
		func() error { return sock.SetReconnectIvl(s.opts.ReconnectInterval) },
		func() error { return sock.SetReconnectIvlMax(s.opts.ReconnectMax) },
		func() error { return sock.SetSubscribe(topic) },
	} {
		if err := set(); err != nil {
			return err
		}
	}
	return nil
}

// connect opens pull-mode stream st's SUB socket, with a connection monitor.
func (s *Subscriber) connect(st *stream) (*zmq4.Socket, *zmq4.Socket, error) {
	addr := st.stats.Endpoint // set at creation, never written again
	sock, err := s.zctx.NewSocket(zmq4.SUB)
	if err != nil {
		return nil, nil, fmt.Errorf("events: new SUB socket for %s: %w", st.ref, err)
	}
	fail := func(err error) (*zmq4.Socket, *zmq4.Socket, error) {
		sock.Close()
		return nil, nil, fmt.Errorf("events: SUB socket for %s at %s: %w", st.ref, addr, err)
	}
	if err := s.setSockopts(sock, st.topic); err != nil {
		return fail(err)
	}
	monAddr := "inproc://kvindex-monitor-" + strconv.FormatInt(s.monitors.Add(1), 10)
	mon, err := monitor(s.zctx.NewSocket, sock, monAddr, zmq4.EVENT_CONNECTED|zmq4.EVENT_DISCONNECTED|zmq4.EVENT_CLOSED)
	if err != nil {
		return fail(err)
	}
	if err := sock.Connect(addr); err != nil {
		mon.Close()
		return fail(err)
	}
	return sock, mon, nil
}

// monitor returns a PAIR socket, made by newSocket, that receives sock's
// events at addr.
func monitor(newSocket func(zmq4.Type) (*zmq4.Socket, error), sock *zmq4.Socket, addr string, events zmq4.Event) (*zmq4.Socket, error) {
	if err := sock.Monitor(addr, events); err != nil {
		return nil, err
	}
	mon, err := newSocket(zmq4.PAIR)
	if err != nil {
		return nil, err
	}
	_ = mon.SetLinger(0)
	if err := mon.Connect(addr); err != nil {
		mon.Close()
		return nil, err
	}
	return mon, nil
}

// receive is one socket's loop, r its routing state (a pull-mode stream or
// a push listener's socket); it owns and closes sock and mon.
func (s *Subscriber) receive(ctx context.Context, sock, mon *zmq4.Socket, r *receiver) error {
	defer sock.Close()
	poller := zmq4.NewPoller()
	poller.Add(sock, zmq4.POLLIN)
	if mon != nil {
		defer mon.Close()
		poller.Add(mon, zmq4.POLLIN)
	}
	r.dec = events.NewDecoder()
	st := r.st
	var rearmed time.Time
	for ctx.Err() == nil {
		polled, err := poller.Poll(s.opts.PollInterval)
		if err != nil {
			switch zmq4.AsErrno(err) {
			case zmq4.ETERM:
				return nil
			case zmq4.Errno(syscall.EINTR):
				continue
			}
			return fmt.Errorf("zmq: poll: %w", err)
		}
		if st != nil {
			rearmed = s.rearm(sock, st, rearmed)
		}
		for _, p := range polled {
			if p.Socket == mon {
				r.monitorEvent(mon)
				continue
			}
			// Drain what is queued before polling again.
			for ctx.Err() == nil {
				frames, err := sock.RecvMessageBytes(zmq4.DONTWAIT)
				if err != nil {
					switch zmq4.AsErrno(err) {
					case zmq4.Errno(syscall.EAGAIN):
					case zmq4.ETERM:
						return nil
					default:
						return fmt.Errorf("zmq: receive: %w", err)
					}
					break
				}
				r.handle(ctx, frames)
			}
		}
	}
	return nil
}

// rearm reconnects st's socket after twice ReconnectMax without a
// connection (and since the last re-arm), returning when it last did:
// libzmq gives a connection up after a protocol error such as an oversized
// message.
func (s *Subscriber) rearm(sock *zmq4.Socket, st *stream, last time.Time) time.Time {
	since := st.disconnected.Load()
	if st.connected.Load() || since == 0 {
		return last
	}
	now, after := time.Now(), 2*s.opts.ReconnectMax
	if now.Sub(time.Unix(0, since)) < after || now.Sub(last) < after {
		return last
	}
	addr := st.stats.Endpoint // set at creation, never written again
	_ = sock.Disconnect(addr)
	if err := sock.Connect(addr); err != nil {
		st.problem(fmt.Errorf("reconnect to %s: %w", addr, err), false)
		return now
	}
	s.opts.Logger.Info("engine connection re-armed after it stayed down (libzmq gives a connection up after a protocol error, such as a message over max_message_bytes)", "worker", st.ref.String(), "endpoint", addr)
	return now
}

// receiver is one socket's decoding and routing state.
type receiver struct {
	sub *Subscriber
	dec *events.Decoder
	st  *stream       // pull mode: the endpoint's stream
	pl  *PushListener // push mode
	pli int           // push mode: pl's index in SubscriberOptions.Push
	// push mode: the socket's bound address and the DP rank its port stands
	// for, or -1 on a listener of DPSize 1 (the payload's rank decides).
	addr string
	rank int
	// push mode: the streams reached, by topic and rank; bounded by
	// MaxWorkers times the topics naming each worker.
	streams map[pushKey]*stream
}

// monitorEvent updates the pull stream's connection state.
func (r *receiver) monitorEvent(mon *zmq4.Socket) {
	ev, addr, _, err := mon.RecvEvent(zmq4.DONTWAIT)
	if err != nil {
		return
	}
	if r.pl != nil {
		if ev == zmq4.EVENT_HANDSHAKE_FAILED_AUTH {
			r.sub.refuse(r.pli, refusedAddress, "connection from an address not in push.allow refused", "peer", addr)
		}
		return
	}
	switch ev {
	case zmq4.EVENT_CONNECTED:
		r.st.connected.Store(true)
		r.st.disconnected.Store(0)
		select {
		case r.st.connectedCh <- struct{}{}:
		default: // one is pending already
		}
	case zmq4.EVENT_DISCONNECTED, zmq4.EVENT_CLOSED:
		r.st.connected.Store(false)
		r.st.disconnected.CompareAndSwap(0, time.Now().UnixNano())
	}
	r.st.refreshHealth()
}

// handle decodes one message and hands it to its worker's stream.
func (r *receiver) handle(ctx context.Context, frames [][]byte) {
	now := time.Now()
	if len(frames) != 3 || len(frames[1]) != 8 {
		seqLen := -1
		if len(frames) > 1 {
			seqLen = len(frames[1])
		}
		err := fmt.Errorf("%w: %d frames (seq frame %d bytes), want [topic, 8-byte seq, payload]", ErrFrames, len(frames), seqLen)
		st := r.st
		switch {
		case st != nil:
		case len(frames) == 0:
			r.sub.refuse(r.pli, refusedUndecodable, "a message with no frames")
		default:
			st = r.streamForTopic(frames[0], nil)
		}
		if st != nil {
			st.problem(err, true)
		}
		return
	}
	m := message{seq: binary.BigEndian.Uint64(frames[1]), at: now, size: int64(len(frames[2])), sum: xxh3.Hash(frames[2])}
	b := r.sub.batches.Get().(*events.Batch)
	if err := r.dec.Decode(frames[2], b); err != nil {
		r.sub.putBatch(b)
		m.decodeErr = err
	} else {
		m.batch = b
	}
	topic, epoch, _ := events.SplitTopic(frames[0])
	st := r.st
	if st == nil {
		st = r.streamForTopic(topic, m.batch)
		if st == nil {
			r.sub.putBatch(m.batch)
			return
		}
	}
	if st.stats.Topic == "" || st.stats.Topic != string(topic) { // compared without allocating
		st.mu.Lock()
		st.stats.Topic = string(topic)
		st.mu.Unlock()
	}
	// A new SGLang epoch is a restart whatever the seq does. rxEpoch is
	// owned by this receiver, the only one feeding st.
	if len(epoch) > 0 && string(epoch) != string(st.rxEpoch) {
		if st.rxEpoch != nil {
			m.newEpoch = string(epoch)
		}
		st.rxEpoch = append(st.rxEpoch[:0], epoch...)
	}
	st.enqueue(m)
}

// checkHealth re-evaluates every worker's health until ctx is done.
func (s *Subscriber) checkHealth(ctx context.Context) {
	tick.Every(ctx, 100*time.Millisecond, func(now time.Time) {
		s.mu.RLock()
		streams := s.streams
		s.mu.RUnlock()
		for _, st := range streams {
			st.setHealth(st.evalHealth(now, &s.opts), now)
		}
	})
}

func (s *Subscriber) putBatch(b *events.Batch) {
	if b != nil {
		s.batches.Put(b)
	}
}

// WorkerStats returns a snapshot per worker (events.StatsSource).
func (s *Subscriber) WorkerStats() []events.WorkerStats {
	s.mu.RLock()
	streams := s.streams
	s.mu.RUnlock()
	out := make([]events.WorkerStats, 0, len(streams))
	for _, st := range streams {
		out = append(out, st.snapshot())
	}
	return out
}

// Health returns the worker's health cell, or nil (events.HealthSource).
func (s *Subscriber) Health(ref events.WorkerRef) *events.HealthCell {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if st := s.byRef[ref]; st != nil {
		return &st.health
	}
	return nil
}
