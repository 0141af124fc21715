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

// checkEndpoint reports what is wrong with ep as a pull-mode endpoint.
func checkEndpoint(ep Endpoint) error {
	switch {
	case ep.Address == "":
		return fmt.Errorf("events: endpoint %s: empty address", ep.Worker)
	case ep.Sink == nil:
		return fmt.Errorf("events: endpoint %s: nil sink", ep.Worker)
	}
	return nil
}

// addPullStream registers ep's stream, resuming after ep.ResumeAfter when
// ep.Resume, and fences its pod off push listeners. The caller holds s.mu
// or owns s (NewSubscriber) and checked ep.
func (s *Subscriber) addPullStream(ep Endpoint) *stream {
	st := newStream(s, ep.Worker, ep.Address, ep.Topic, ep.ReplayEndpoint, ep.Sink, true)
	if ep.Resume {
		st.expected, st.hasExpected, st.joinTried, st.resuming = ep.ResumeAfter+1, true, true, true
		st.stats.LastSeq, st.stats.HasSeq = ep.ResumeAfter, true
	}
	s.pullPods[ep.Worker.Pod] = true
	s.streams = append(s.streams, st)
	s.byRef[ep.Worker] = st
	return st
}

// AddEndpoint subscribes to one more pull-mode engine: before Run as if
// given to NewSubscriber, during Run at once. A worker already known, or a
// call after Run returned (ErrStopped), is an error. Cost: a SUB socket, its
// monitor and two goroutines.
func (s *Subscriber) AddEndpoint(ep Endpoint) error {
	if err := checkEndpoint(ep); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("events: add endpoint %s: %w", ep.Worker, ErrStopped)
	}
	if s.byRef[ep.Worker] != nil {
		return fmt.Errorf("events: add endpoint %s: worker already subscribed", ep.Worker)
	}
	if _, ok := s.pushPods[ep.Worker.Pod]; ok {
		return fmt.Errorf("events: add endpoint %s: pod %q is a push-mode pod", ep.Worker, ep.Worker.Pod)
	}
	if _, ok := s.routedPods[ep.Worker.Pod]; ok {
		return fmt.Errorf("events: add endpoint %s: pod %q is routed on a push listener", ep.Worker, ep.Worker.Pod)
	}
	if s.runCtx == nil {
		s.pull = append(s.pull, pullSource{ep: ep, st: s.addPullStream(ep)})
		return nil
	}
	sock, mon, err := s.connect(ep)
	if err != nil {
		return err
	}
	st := s.addPullStream(ep)
	ctx, a := s.addedLocked(s.runCtx, ep.Worker)
	s.goTracked(a, func() { st.run(ctx) })
	s.goTracked(a, func() {
		if err := s.receive(ctx, sock, mon, st, -1); err != nil {
			st.problem(fmt.Errorf("receive from %s: %w", ep.Address, err), false)
		}
	})
	s.opts.Logger.Info("engine endpoint added", "worker", ep.Worker.String(), "endpoint", ep.Address)
	return nil
}

// addedLocked registers ref's running endpoint under its own context. Callers hold s.mu.
func (s *Subscriber) addedLocked(ctx context.Context, ref events.WorkerRef) (context.Context, *added) {
	ctx, cancel := context.WithCancel(ctx)
	a := &added{cancel: cancel}
	s.added[ref] = a
	return ctx, a
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
	a := s.added[ref] // nil before Run
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
	if a == nil { // before Run: only the configuration changes
		pull := make([]pullSource, 0, len(s.pull))
		for _, p := range s.pull {
			if p.st != st {
				pull = append(pull, p)
			}
		}
		s.pull = pull
	}
	s.mu.Unlock()
	if a != nil {
		a.cancel()
		a.wg.Wait()
	}
	s.opts.Logger.Info("engine endpoint removed", "worker", ref.String())
	return nil
}

// IsPullPod reports whether pod is a pull-mode pod, refused by push listeners.
func (s *Subscriber) IsPullPod(pod string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pullPods[pod]
}
