package zmq

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/lograte"
)

// Reasons a push listener refuses a message (or a connection).
const (
	refusedTopic          = iota // neither routed nor kv@<pod>@<model>
	refusedPullWorker            // names a pull-mode pod (any rank)
	refusedOtherModel            // the pod was claimed for another model
	refusedOtherListener         // another listener routes or claimed the pod
	refusedMaxWorkers            // the listener created MaxWorkers workers
	refusedDPRank                // data_parallel_rank outside [0, MaxDPRank)
	refusedUndecodable           // undecodable, for no known worker (the rank is in the payload)
	refusedNoWorker              // the index refused to add the worker
	refusedAddress               // a connection from an address not in Allow
	refusedRoutedPod             // a kv@ topic names a pod the listener's Routes map
	refusedDPRankMismatch        // data_parallel_rank is not the rank of the port it arrived on
	numRefusals
)

// refusalNames name the reasons in Refusals and metrics.
var refusalNames = [numRefusals]string{"unknown_topic", "pull_worker", "other_model", "other_listener", "max_workers", "dp_rank", "undecodable", "no_worker", "address", "routed_pod", "dp_rank_mismatch"}

// pushRefusals counts refusals and rate-limits their logs, per listener and reason.
type pushRefusals struct {
	counts [][numRefusals]atomic.Int64 // by listener
	mu     sync.Mutex                  // guards logs
	logs   [][numRefusals]lograte.Limiter
}

// refuse counts and logs (rate-limited) one refusal by listener li.
func (s *Subscriber) refuse(li, reason int, msg string, args ...any) {
	n := s.refusals.counts[li][reason].Add(1)
	s.refusals.mu.Lock()
	ok, held := s.refusals.logs[li][reason].Allow(time.Now(), s.opts.LogEvery)
	s.refusals.mu.Unlock()
	if ok {
		args = append(args, "listener", s.opts.Push[li].Address, "reason", refusalNames[reason], "refused_so_far", n, "suppressed", held)
		s.opts.Logger.Warn("push message refused: "+msg, args...)
	}
}

// Refusals returns every push listener's non-zero refusal counts
// (events.RefusalSource), Source its address and Reason a refusalNames entry.
func (s *Subscriber) Refusals() []events.Refusal {
	var out []events.Refusal
	for li := range s.refusals.counts {
		for r := range numRefusals {
			if n := s.refusals.counts[li][r].Load(); n > 0 {
				out = append(out, events.Refusal{Source: s.opts.Push[li].Address, Reason: refusalNames[r], Count: n})
			}
		}
	}
	return out
}

// pushKey is a receiver's cache key: a topic and rank resolve to one stream.
type pushKey struct {
	topic string
	rank  int
}

// resolveTopic maps a push topic to its pod and model: Routes (routed), then
// llm-d's kv@<pod>@<model>.
func (r *receiver) resolveTopic(topic []byte) (route events.TopicRoute, routed, ok bool) {
	if route, ok := r.pl.Routes[string(topic)]; ok {
		return route, true, true
	}
	if pod, model, ok := events.ParseLLMDTopic(string(topic)); ok {
		return events.TopicRoute{Pod: pod, Model: model}, false, true
	}
	return events.TopicRoute{}, false, false
}

// streamForTopic finds or creates the stream of a topic and DP rank, or
// counts the refusal and returns nil. Known: one map probe. The rank is the
// port's (PushListener); on a listener of DPSize 1 the payload's. An
// undecodable message (b nil) reaches a known stream at the port's rank (0
// on a listener of DPSize 1), and never creates one.
func (r *receiver) streamForTopic(topic []byte, b *events.Batch) *stream {
	rank, payload := r.rank, b != nil && b.HasDPRank
	switch {
	case rank < 0 && payload:
		rank = b.DPRank
	case rank < 0:
		rank = 0
	case payload && b.DPRank != rank:
		r.sub.refuse(r.pli, refusedDPRankMismatch, fmt.Sprintf("data_parallel_rank %d arrived on the port of rank %d: vLLM offsets a connecting endpoint's port by the rank, so the engine's endpoint should be the listener's base address", b.DPRank, rank),
			"topic", snippet(topic), "address", r.addr)
		return nil
	}
	if st := r.streams[pushKey{string(topic), rank}]; st != nil { // compiled without allocating
		return st
	}
	if b == nil {
		r.sub.refuse(r.pli, refusedUndecodable, "an undecodable message for no known worker", "topic", snippet(topic))
		return nil
	}
	route, routed, ok := r.resolveTopic(topic)
	if !ok {
		r.sub.refuse(r.pli, refusedTopic, "unknown topic: map it under push.routes or use kv@<pod>@<model>", "topic", snippet(topic))
		return nil
	}
	if rank < 0 || rank >= MaxDPRank {
		r.sub.refuse(r.pli, refusedDPRank, fmt.Sprintf("data_parallel_rank %d outside [0, %d)", rank, MaxDPRank), "topic", snippet(topic))
		return nil
	}
	ref := events.WorkerRef{Pod: route.Pod, DPRank: rank}
	st, reason, err := r.sub.pushStream(ref, route, routed, r.pli, r.addr)
	if err != nil {
		r.sub.refuse(r.pli, reason, err.Error(), "worker", ref.String(), "topic", snippet(topic))
		return nil
	}
	if r.streams == nil {
		r.streams = make(map[pushKey]*stream)
	}
	r.streams[pushKey{string(topic), rank}] = st
	return st
}

// pushStream returns (creating and starting it the first time) the stream of
// push worker ref for listener li, heard on its socket at addr, or why the
// pod fence refuses it (see PushListener).
func (s *Subscriber) pushStream(ref events.WorkerRef, route events.TopicRoute, routed bool, li int, addr string) (*stream, int, error) {
	if owner, ok := s.routedPods[ref.Pod]; ok {
		switch {
		case owner != li:
			return nil, refusedOtherListener, fmt.Errorf("pod %q is routed on push listener %s", ref.Pod, s.opts.Push[owner].Address)
		case !routed:
			return nil, refusedRoutedPod, fmt.Errorf("pod %q is routed (push routes): only its routed topics reach it", ref.Pod)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pullPods[ref.Pod] {
		return nil, refusedPullWorker, fmt.Errorf("pod %q is a pull-mode pod", ref.Pod)
	}
	pl := &s.opts.Push[li]
	if c, ok := s.pushPods[ref.Pod]; ok {
		switch {
		case c.listener != li:
			return nil, refusedOtherListener, fmt.Errorf("pod %q belongs to push listener %s", ref.Pod, s.opts.Push[c.listener].Address)
		case c.model != route.Model:
			return nil, refusedOtherModel, fmt.Errorf("pod %q serves model %q, not %q", ref.Pod, c.model, route.Model)
		}
	}
	if st := s.byRef[ref]; st != nil {
		if st.monitored || st.listener != li || st.model != route.Model {
			brokenInvariant(fmt.Sprintf("push worker %s (listener %d, model %q, pull %v) passed the pod fence of listener %d, model %q", ref, st.listener, st.model, st.monitored, li, route.Model))
		}
		return st, 0, nil
	}
	if s.pushWorkers[li] >= pl.MaxWorkers {
		return nil, refusedMaxWorkers, fmt.Errorf("listener has created its maximum of %d workers (push max_workers)", pl.MaxWorkers)
	}
	replay := ""
	if route.ReplayEndpoint != "" {
		var err error
		if replay, err = events.OffsetEndpoint(route.ReplayEndpoint, ref.DPRank); err != nil {
			return nil, refusedNoWorker, err
		}
	}
	// Register the health cell before the worker exists in the index.
	st := newStream(s, ref, addr, "", replay, nil, false)
	st.listener, st.model = li, route.Model
	s.byRef[ref] = st
	sink, err := s.opts.NewWorker(ref, route.Model, replay)
	if err != nil {
		delete(s.byRef, ref)
		return nil, refusedNoWorker, fmt.Errorf("new push worker %s (model %q): %w", ref, route.Model, err)
	}
	st.sink = sink
	s.pushWorkers[li]++
	s.pushPods[ref.Pod] = podClaim{listener: li, model: route.Model}
	s.streams = append(s.streams, st)
	if s.runCtx != nil {
		ctx := s.runCtx
		s.goTracked(nil, func() { st.run(ctx) })
	}
	s.opts.Logger.Info("push-mode worker discovered", "worker", ref.String(), "model", route.Model, "listener", pl.Address, "address", addr)
	return st, 0, nil
}

// authStart starts zmq4's ZAP handler once; it serves the default context only.
var authStart = sync.OnceValue(zmq4.AuthStart)

// bind opens push listener li's SUB socket at addr (one of its DP ranks')
// with a monitor of refused connections; it is polled once bound (an
// unpolled bound SUB drops everything: libzmq #1594). With Allow it lives in
// zmq4's default context, where ZAP runs, under the listener's domain, whose
// allowlist is Allow.
func (s *Subscriber) bind(li int, addr string) (sock, mon *zmq4.Socket, err error) {
	pl := &s.opts.Push[li]
	newSocket := s.zctx.NewSocket
	if len(pl.Allow) > 0 {
		if err := authStart(); err != nil {
			return nil, nil, fmt.Errorf("zmq: push listener %s: start the ZAP handler: %w", addr, err)
		}
		newSocket = zmq4.NewSocket
	}
	sock, err = newSocket(zmq4.SUB)
	if err != nil {
		return nil, nil, fmt.Errorf("zmq: new SUB socket for push listener %s: %w", addr, err)
	}
	fail := func(err error) (*zmq4.Socket, *zmq4.Socket, error) {
		sock.Close()
		if mon != nil {
			mon.Close()
		}
		return nil, nil, fmt.Errorf("zmq: push listener %s: %w", addr, err)
	}
	if err := s.setSockopts(sock, pl.Topic); err != nil {
		return fail(err)
	}
	if len(pl.Allow) > 0 {
		domain := fmt.Sprintf("kvindex-push-%p-%d", s, li)
		if addr == s.pushAddrs[li][0] { // once per listener: CIDRs would add up
			zmq4.AuthAllow(domain, pl.Allow...)
		}
		if err := sock.ServerAuthNull(domain); err != nil {
			return fail(err)
		}
	}
	// Unique in the process: with Allow the socket is in the default context.
	monAddr := fmt.Sprintf("inproc://kvindex-push-monitor-%p-%d", s, s.monitors.Add(1))
	if mon, err = monitor(newSocket, sock, monAddr, zmq4.EVENT_HANDSHAKE_FAILED_AUTH); err != nil {
		return fail(err)
	}
	if err := sock.Bind(addr); err != nil {
		return fail(fmt.Errorf("bind: %w", err))
	}
	return sock, mon, nil
}

// snippet quotes at most 64 bytes of a topic for a log line.
func snippet(b []byte) string {
	if len(b) > 64 {
		return fmt.Sprintf("%q... (%d bytes)", b[:64], len(b))
	}
	return fmt.Sprintf("%q", b)
}
