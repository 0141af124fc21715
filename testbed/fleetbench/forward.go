package fleetbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/pebbe/zmq4"
)

// floorSubject is the subject prefix the forwarders publish on, before
// the pod name.
const floorSubject = "kvfleetbench.floor."

// forwarders are the lag benchmark's floor: it moves the path's engine
// frames over the same hops, in the same processes, and applies nothing.
// A forwarder per engine (a ZeroMQ SUB socket and a NATS connection of
// its own, as an agent has) publishes each batch's payload as it arrived
// until stop, and a subscriber in the replica's place (sink) reads only
// the batch's timestamp.
type forwarders struct {
	zctx      *zmq4.Context
	conns     []*nats.Conn
	forwarded atomic.Int64 // frames published
	failed    atomic.Int64 // frames that could not be published
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	mu        sync.Mutex // guards err
	err       error      // a forwarder's first receive error
}

// startForwarders connects one forwarder to each engine and to NATS at
// url.
func startForwarders(ctx context.Context, url string, es []enginePort) (*forwarders, error) {
	zctx, err := zmq4.NewContext()
	if err != nil {
		return nil, fmt.Errorf("fleetbench: forwarder: %w", err)
	}
	f := &forwarders{zctx: zctx}
	ctx, f.cancel = context.WithCancel(ctx)
	for _, e := range es {
		nc, err := connect(url, "kvfleetbench forwarder "+e.Pod)
		if err != nil {
			f.stop()
			return nil, err
		}
		f.conns = append(f.conns, nc)
		sock, err := f.subscribe(e)
		if err != nil {
			f.stop()
			return nil, err
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := f.run(ctx, sock, nc, floorSubject+e.Pod); err != nil {
				f.mu.Lock()
				f.err = errors.Join(f.err, fmt.Errorf("fleetbench: forwarder of %s: %w", e.Pod, err))
				f.mu.Unlock()
			}
		}()
	}
	return f, nil
}

// subscribe opens a SUB socket to e with the receive bound an agent's
// subscriber has (events/zmq's default RcvHWM).
func (f *forwarders) subscribe(e enginePort) (*zmq4.Socket, error) {
	sock, err := f.zctx.NewSocket(zmq4.SUB)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: forwarder of %s: %w", e.Pod, err)
	}
	err = errors.Join(sock.SetLinger(0), sock.SetRcvhwm(100_000), sock.SetSubscribe(""))
	if err == nil {
		err = sock.Connect(e.Endpoint)
	}
	if err != nil {
		sock.Close()
		return nil, fmt.Errorf("fleetbench: forwarder of %s at %s: %w", e.Pod, e.Endpoint, err)
	}
	return sock, nil
}

// run is one forwarder's loop, which owns sock: each [topic, seq,
// payload] message's payload is published on subject as it is.
func (f *forwarders) run(ctx context.Context, sock *zmq4.Socket, nc *nats.Conn, subject string) error {
	defer sock.Close()
	poller := zmq4.NewPoller()
	poller.Add(sock, zmq4.POLLIN)
	for ctx.Err() == nil {
		if _, err := poller.Poll(100 * time.Millisecond); err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EINTR) {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		for ctx.Err() == nil {
			frames, err := sock.RecvMessageBytes(zmq4.DONTWAIT)
			if err != nil {
				if zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN) {
					break
				}
				return fmt.Errorf("receive: %w", err)
			}
			if err := nc.Publish(subject, frames[len(frames)-1]); err != nil {
				f.failed.Add(1)
				continue
			}
			f.forwarded.Add(1)
		}
	}
	return nil
}

// stop ends the forwarders, flushes and closes their connections and
// returns the first receive error.
func (f *forwarders) stop() error {
	f.cancel()
	f.wg.Wait()
	for _, nc := range f.conns {
		_ = nc.Flush()
		nc.Close()
	}
	f.zctx.Term()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// sink is the floor's subscriber: the lag of every frame it receives
// while on, from the engine batch's timestamp.
type sink struct {
	lag    lagRecorder
	frames atomic.Int64 // every frame received
	bad    atomic.Int64 // frames without a readable timestamp
}

// handle records one frame.
func (s *sink) handle(m *nats.Msg) {
	s.frames.Add(1)
	ts, err := batchTime(m.Data)
	if err != nil {
		s.bad.Add(1)
		return
	}
	s.lag.record(ts)
}

// runFloorSink is the replica role in floor mode: subscribe, report
// "live", record until "stop", answering "count" (frames received as
// deltas) meanwhile, then answer "stop" with the result.
func runFloorSink(ctx context.Context, url string, in *Commands, out *Reporter) error {
	nc, err := connect(url, "kvfleetbench floor subscriber")
	if err != nil {
		return err
	}
	defer nc.Close()
	var s sink
	sub, err := nc.Subscribe(floorSubject+">", s.handle)
	if err == nil {
		err = nc.Flush() // the subscription is in effect at the server
	}
	if err != nil {
		return fmt.Errorf("fleetbench: floor subscriber: %w", err)
	}

	s.lag.start(0)
	if err := out.Send("live", liveReport{}); err != nil {
		return err
	}
	for {
		cmd, ok := in.Next(ctx)
		if !ok {
			return nil
		}
		switch cmd {
		case "count":
			if err := out.Send("count", lagReport{Deltas: s.frames.Load()}); err != nil {
				return err
			}
		case "stop":
			r := s.lag.report(s.frames.Load())
			dropped, _ := sub.Dropped()
			r.Problems = s.bad.Load() + int64(dropped)
			if err := out.Send("stop", r); err != nil {
				return err
			}
			return in.Exit(ctx)
		}
	}
}

// batchTime reads an encoded vLLM batch's timestamp (the first element of
// its array envelope, a float64) and nothing else.
func batchTime(b []byte) (float64, error) {
	if len(b) < 10 || (b[0] != 0x92 && b[0] != 0x93) || b[1] != 0xcb {
		return 0, fmt.Errorf("fleetbench: a frame of %d bytes is no array-envelope batch with a float64 timestamp", len(b))
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b[2:10])), nil
}
