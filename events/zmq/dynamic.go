package zmq

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvindex/kvindex/events"
)

// ErrUnknownEndpoint reports a RemoveEndpoint of no pull-mode endpoint.
var ErrUnknownEndpoint = errors.New("zmq: no such pull-mode endpoint")

// ErrStopped reports an AddEndpoint after Run returned.
var ErrStopped = errors.New("zmq: subscriber stopped")

// added is a running pull-mode endpoint's own context, for RemoveEndpoint.
type added struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// AddEndpoint subscribes to one more pull-mode engine: before Run as if
// given to NewSubscriber, during Run at once. A worker already known, or a
// call after Run returned (ErrStopped), is an error. Cost: a SUB socket, its
// monitor and two goroutines.
func (s *Subscriber) AddEndpoint(ep Endpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("events: add endpoint %s: "+format, append([]any{ep.Worker}, args...)...)
	}
	_, pushPod := s.pushPods[ep.Worker.Pod]
	_, routed := s.routedPods[ep.Worker.Pod]
	switch {
	case ep.Address == "":
		return fail("empty address")
	case ep.Sink == nil:
		return fail("nil sink")
	case s.stopped:
		return fail("%w", ErrStopped)
	case s.byRef[ep.Worker] != nil:
		return fail("worker already subscribed")
	case pushPod:
		return fail("pod %q is a push-mode pod", ep.Worker.Pod)
	case routed:
		return fail("pod %q is routed on a push listener", ep.Worker.Pod)
	}
	st := newStream(s, ep.Worker, ep.Address, ep.Topic, ep.ReplayEndpoint, ep.Sink, true)
	if ep.Resume {
		st.expected, st.hasExpected, st.joinTried, st.resuming = ep.ResumeAfter+1, true, true, true
		st.stats.LastSeq, st.stats.HasSeq = ep.ResumeAfter, true
	}
	if s.runCtx != nil {
		err := s.startPull(s.runCtx, st, func(err error) {
			st.problem(fmt.Errorf("receive from %s: %w", ep.Address, err), false)
		})
		if err != nil {
			return err
		}
		s.opts.Logger.Info("engine endpoint added", "worker", ep.Worker.String(), "endpoint", ep.Address)
	}
	// Registered once connected: an endpoint that fails leaves nothing behind.
	s.pullPods[ep.Worker.Pod] = true
	s.streams = append(s.streams, st)
	s.byRef[ep.Worker] = st
	return nil
}

// startPull connects pull-mode stream st and starts its stream and receive
// goroutines under their own context (RemoveEndpoint); onErr takes the
// receive loop's error. Callers hold s.mu.
func (s *Subscriber) startPull(ctx context.Context, st *stream, onErr func(error)) error {
	sock, mon, err := s.connect(st)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &added{cancel: cancel}
	s.added[st.ref] = a
	s.goTracked(a, func() { st.run(ctx) })
	s.goTracked(a, func() {
		if err := s.receive(ctx, sock, mon, &receiver{sub: s, st: st, pli: -1}); err != nil {
			onErr(err)
		}
	})
	return nil
}

// RemoveEndpoint stops receiving from pull-mode worker ref: its socket
// closes, its stream stops and it leaves WorkerStats and Health; once it
// returns nothing more reaches the sink. The caller removes the worker from
// the index. Push-mode workers cannot be removed.
func (s *Subscriber) RemoveEndpoint(ref events.WorkerRef) error {
	s.mu.Lock()
	st := s.byRef[ref]
	if st == nil || !st.monitored {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrUnknownEndpoint, ref)
	}
	a := s.added[ref]
	delete(s.byRef, ref)
	delete(s.added, ref)
	pullPod := false
	for r, o := range s.byRef {
		if r.Pod == ref.Pod && o.monitored {
			pullPod = true
		}
	}
	if !pullPod {
		delete(s.pullPods, ref.Pod)
	}
	// A new slice: readers iterate the old one outside the lock.
	streams := make([]*stream, 0, len(s.streams))
	for _, o := range s.streams {
		if o != st {
			streams = append(streams, o)
		}
	}
	s.streams = streams
	s.mu.Unlock()
	if a != nil { // nil before Run: only the configuration changes
		a.cancel()
		a.wg.Wait()
	}
	s.opts.Logger.Info("engine endpoint removed", "worker", ref.String())
	return nil
}
