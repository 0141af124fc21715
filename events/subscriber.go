package events

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// ErrFrames reports a ZMQ message that is not vLLM's [topic, seq, payload].
var ErrFrames = errors.New("events: malformed message frames")

// Endpoint is one engine publisher to subscribe to in pull mode: the engine
// binds its PUB socket and the subscriber connects.
type Endpoint struct {
	// Worker is the worker whose events arrive here.
	Worker WorkerRef
	// Address is the ZMQ endpoint to connect to, e.g. tcp://10.0.0.5:5557.
	Address string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string
	// Sink receives the worker's batches in seq order.
	Sink Sink
}

// SubscriberOptions tune a Subscriber. The zero value is usable.
type SubscriberOptions struct {
	// Logger receives problem reports; nil discards them.
	Logger *slog.Logger
	// PollInterval bounds how long a receive loop waits before it checks
	// for shutdown; 0 means 100 ms.
	PollInterval time.Duration
	// ReconnectInterval and ReconnectMax set libzmq's reconnect backoff;
	// 0 means 100 ms and 5 s.
	ReconnectInterval, ReconnectMax time.Duration
	// RcvHWM is the SUB socket's receive high-water mark in messages; 0
	// means 100,000, vLLM's own send HWM.
	RcvHWM int
	// LogEvery rate-limits repeated problem logs per worker: the first
	// problem is logged at once, then at most one line per interval with
	// the number suppressed; 0 means one minute.
	LogEvery time.Duration
}

func (o *SubscriberOptions) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.ReconnectInterval <= 0 {
		o.ReconnectInterval = 100 * time.Millisecond
	}
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = 5 * time.Second
	}
	if o.RcvHWM <= 0 {
		o.RcvHWM = 100_000
	}
	if o.LogEvery <= 0 {
		o.LogEvery = time.Minute
	}
}

// Subscriber receives vLLM KV events over ZMQ SUB sockets, tracks each
// worker's seq, decodes each message and hands the batch to the worker's
// Sink. It implements StatsSource.
//
// # Concurrency
//
// Run starts one goroutine per endpoint; each owns its socket, decoder and
// batch, so one worker's batches are decoded and applied in seq order by a
// single goroutine. WorkerStats may be called from any goroutine.
type Subscriber struct {
	opts    SubscriberOptions
	streams []*stream
}

// stream is one endpoint's receive state.
type stream struct {
	ep  Endpoint
	dec *Decoder

	mu    sync.Mutex // guards stats and the log limiter
	stats WorkerStats
	log   limiter
}

// NewSubscriber checks the endpoints and returns a subscriber for them.
// Nothing connects until Run.
func NewSubscriber(opts SubscriberOptions, eps ...Endpoint) (*Subscriber, error) {
	opts.defaults()
	s := &Subscriber{opts: opts}
	seen := make(map[WorkerRef]bool, len(eps))
	for i, ep := range eps {
		if ep.Address == "" {
			return nil, fmt.Errorf("events: endpoint %d (%s): empty address", i, ep.Worker)
		}
		if ep.Sink == nil {
			return nil, fmt.Errorf("events: endpoint %d (%s): nil sink", i, ep.Worker)
		}
		if seen[ep.Worker] {
			return nil, fmt.Errorf("events: endpoint %d: worker %s configured twice", i, ep.Worker)
		}
		seen[ep.Worker] = true
		s.streams = append(s.streams, &stream{
			ep:    ep,
			dec:   NewDecoder(),
			stats: WorkerStats{Worker: ep.Worker, Endpoint: ep.Address, Topic: ep.Topic},
		})
	}
	return s, nil
}

// Run connects every endpoint and receives until ctx is done. It returns
// ctx's error after every socket is closed, or the first setup error.
func (s *Subscriber) Run(ctx context.Context) error {
	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("events: create zmq context: %w", err)
	}
	defer zctx.Term()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(s.streams))
	var wg sync.WaitGroup
	for _, st := range s.streams {
		sock, err := s.connect(zctx, st.ep)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.receive(ctx, sock, st); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	return ctx.Err()
}

// connect opens a SUB socket to ep with the subscriber's options.
func (s *Subscriber) connect(zctx *zmq.Context, ep Endpoint) (*zmq.Socket, error) {
	sock, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, fmt.Errorf("events: new SUB socket for %s: %w", ep.Worker, err)
	}
	for _, set := range []func() error{
		func() error { return sock.SetLinger(0) },
		func() error { return sock.SetRcvhwm(s.opts.RcvHWM) },
		func() error { return sock.SetReconnectIvl(s.opts.ReconnectInterval) },
		func() error { return sock.SetReconnectIvlMax(s.opts.ReconnectMax) },
		func() error { return sock.SetSubscribe(ep.Topic) },
		func() error { return sock.Connect(ep.Address) },
	} {
		if err := set(); err != nil {
			sock.Close()
			return nil, fmt.Errorf("events: SUB socket for %s at %s: %w", ep.Worker, ep.Address, err)
		}
	}
	return sock, nil
}

// receive is one endpoint's loop; it owns sock and closes it.
func (s *Subscriber) receive(ctx context.Context, sock *zmq.Socket, st *stream) error {
	defer sock.Close()
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	var batch Batch
	for ctx.Err() == nil {
		polled, err := poller.Poll(s.opts.PollInterval)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(zmq.ETERM) {
				return nil
			}
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("events: poll %s: %w", st.ep.Address, err)
		}
		if len(polled) == 0 {
			continue
		}
		// Drain what is queued before polling again.
		for ctx.Err() == nil {
			frames, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) { // queue drained
					break
				}
				if zmq.AsErrno(err) == zmq.Errno(zmq.ETERM) {
					return nil
				}
				return fmt.Errorf("events: receive from %s: %w", st.ep.Address, err)
			}
			s.handle(st, frames, &batch)
		}
	}
	return nil
}

// handle processes one message: seq tracking, decoding and applying.
func (s *Subscriber) handle(st *stream, frames [][]byte, batch *Batch) {
	now := time.Now()
	if len(frames) != 3 || len(frames[1]) != 8 {
		err := fmt.Errorf("%w from %s: %d frames (seq frame %d bytes), want [topic, 8-byte seq, payload]", ErrFrames, st.ep.Address, len(frames), frameLen(frames, 1))
		s.problem(st, now, "frames", err, true)
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	st.mu.Lock()
	prev, had := st.stats.LastSeq, st.stats.HasSeq
	st.stats.LastSeq, st.stats.HasSeq = seq, true
	st.stats.LastMessage = now
	if st.stats.Topic != string(frames[0]) { // compared without allocating
		st.stats.Topic = string(frames[0])
	}
	var gap uint64
	restart := false
	switch {
	case !had:
	case seq == prev+1:
	case seq > prev+1:
		gap = seq - prev - 1
		st.stats.Gaps++
		st.stats.MissedBatches += int64(gap)
	default:
		restart = true
		st.stats.Restarts++
	}
	st.mu.Unlock()
	if gap > 0 {
		s.opts.Logger.Warn("kv events lost: seq gap", "worker", st.ep.Worker.String(), "from", prev, "to", seq, "missed", gap)
	}
	if restart {
		reason := fmt.Sprintf("seq went back from %d to %d: engine restarted", prev, seq)
		st.ep.Sink.Reset(reason)
		s.opts.Logger.Warn("engine restart detected; worker cleared", "worker", st.ep.Worker.String(), "reason", reason)
	}
	if err := st.dec.Decode(frames[2], batch); err != nil {
		s.problem(st, now, "decode", fmt.Errorf("seq %d: %w", seq, err), true)
		return
	}
	st.mu.Lock()
	st.stats.Batches++
	st.stats.Events += int64(len(batch.Events))
	st.mu.Unlock()
	if err := st.ep.Sink.ApplyBatch(batch); err != nil {
		s.problem(st, now, "apply", fmt.Errorf("seq %d: %w", seq, err), false)
	}
}

// problem counts and logs (rate-limited per worker) a skipped message or event.
func (s *Subscriber) problem(st *stream, now time.Time, kind string, err error, decode bool) {
	st.mu.Lock()
	if decode {
		st.stats.DecodeErrors++
	} else {
		st.stats.ApplyErrors++
	}
	st.stats.LastError = err.Error()
	emit, suppressed := st.log.allow(now, s.opts.LogEvery)
	st.mu.Unlock()
	if emit {
		s.opts.Logger.Warn("kv event skipped", "worker", st.ep.Worker.String(), "kind", kind, "err", err, "suppressed", suppressed)
	}
}

// WorkerStats returns a snapshot per endpoint (StatsSource).
func (s *Subscriber) WorkerStats() []WorkerStats {
	out := make([]WorkerStats, 0, len(s.streams))
	for _, st := range s.streams {
		st.mu.Lock()
		out = append(out, st.stats)
		st.mu.Unlock()
	}
	return out
}

func frameLen(frames [][]byte, i int) int {
	if i < len(frames) {
		return len(frames[i])
	}
	return -1
}

// limiter lets the first report through, then one per interval, counting
// what it held back.
type limiter struct {
	last       time.Time
	suppressed int
}

func (l *limiter) allow(now time.Time, every time.Duration) (bool, int) {
	if l.last.IsZero() || now.Sub(l.last) >= every {
		n := l.suppressed
		l.last, l.suppressed = now, 0
		return true, n
	}
	l.suppressed++
	return false, 0
}
