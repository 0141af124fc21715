package sim

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// evKind is the kind of a scheduled simulation event: an engine's step
// ends, a lagged batch reaches the index, or a router.Poller scrapes.
type evKind uint8

const (
	evStepEnd evKind = iota
	evDeliver
	evPoll
)

// simEvent is one scheduled event; seq orders events of equal time by
// scheduling order, so runs are deterministic.
type simEvent struct {
	t       time.Duration
	seq     uint64
	kind    evKind
	engine  int32
	payload []byte
}

// eventHeap is a min-heap (container/heap) of events by (t, seq).
type eventHeap []simEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].t < h[j].t || (h[i].t == h[j].t && h[i].seq < h[j].seq)
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	s := *h
	e := s[len(s)-1]
	s[len(s)-1] = simEvent{}
	*h = s[:len(s)-1]
	return e
}

// loop runs one router's fleet over a workload: the discrete-event
// simulation shared by virtual and live mode.
type loop struct {
	w      *workload.Workload
	o      *Options
	router router.Router
	fleet  *fleet
	rec    *metrics.Recorder
	heap   eventHeap
	seq    uint64

	// publish hands an engine's step batch to kvindex (nil: no index).
	publish func(engine int, b *events.Batch, now time.Duration) error
	// Live mode: wait blocks until virtual time t is due; clock is the
	// wall clock in virtual time, so that a request reaches its engine as
	// long after arrival as its router's call took (part of its TTFT, as
	// in production).
	wait  func(ctx context.Context, t time.Duration) error
	clock func() time.Duration
	// deliver applies a lagged payload (virtual mode).
	deliver func(engine int, payload []byte)

	content []uint64
	rreq    router.Request
	// now is the current event's virtual time, kvindex's tracker's clock
	// in virtual mode.
	now time.Duration
}

func (l *loop) schedule(e simEvent) {
	e.seq = l.seq
	l.seq++
	heap.Push(&l.heap, e)
}

// run simulates every request to completion.
func (l *loop) run(ctx context.Context) error {
	reqs := l.w.Requests
	next := 0
	bs := l.o.Engine.BlockSize
	poller, _ := l.router.(router.Poller)
	if poller != nil {
		l.schedule(simEvent{kind: evPoll})
	}
	for next < len(reqs) || len(l.heap) > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sim: %s: %w", l.router.Name(), err)
		}
		// Serial: an arrival waits for the heap to empty (engines idle,
		// batches applied).
		arrival := next < len(reqs) && (len(l.heap) == 0 || !l.o.Serial && reqs[next].Arrival < l.heap[0].t)
		var t time.Duration
		if arrival {
			t = reqs[next].Arrival
		} else {
			t = l.heap[0].t
		}
		if l.wait != nil {
			if err := l.wait(ctx, t); err != nil {
				return err
			}
		}
		l.now = max(l.now, t)
		now := l.now
		if arrival {
			if err := l.arrive(ctx, &reqs[next], now, bs); err != nil {
				return err
			}
			next++
			continue
		}
		ev := heap.Pop(&l.heap).(simEvent)
		switch ev.kind {
		case evDeliver:
			l.deliver(int(ev.engine), ev.payload)
		case evPoll:
			poller.Poll()
			if next < len(reqs) {
				l.schedule(simEvent{t: ev.t + poller.PollInterval(), kind: evPoll})
			}
		case evStepEnd:
			if err := l.stepEnd(ctx, int(ev.engine), now); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *loop) arrive(ctx context.Context, req *workload.Request, now time.Duration, bs int) error {
	l.rec.Arrived(req.ID, now)
	l.content = req.AppendBlockContent(l.content[:0], bs, req.OutputSegment(l.o.Seed))
	l.rreq = router.Request{Request: req, Content: l.content, PromptBlocks: req.PromptLen / bs}
	var asked time.Duration
	if l.clock != nil {
		asked = l.clock()
	}
	i, err := l.router.Route(ctx, &l.rreq)
	if err != nil {
		return err
	}
	if l.clock != nil {
		// Only the call is charged, not the loop's own lateness in
		// reaching the arrival (a simulator artefact).
		d := max(l.clock()-asked, 0)
		l.rec.RouteDelay(d)
		now += d
		l.now = max(l.now, now)
	}
	if i < 0 || i >= len(l.fleet.engines) {
		return fmt.Errorf("sim: %s routed request %d to engine %d of %d", l.router.Name(), req.ID, i, len(l.fleet.engines))
	}
	if p, ok := l.router.(router.Predictor); ok {
		if tokens, ok := p.Predicted(); ok {
			// The engine hits at most the full blocks before the last token
			// (as CachedTokens counts its hit now, unpublished steps
			// included).
			l.rec.Predicted(req.ID, min(tokens, (req.PromptLen-1)/bs*bs), l.fleet.CachedTokens(i, &l.rreq))
		}
	}
	if p, ok := l.router.(router.Estimator); ok {
		if est, ok := p.Estimated(); ok {
			l.rec.Estimated(req.ID, est)
		}
	}
	e := l.fleet.engines[i]
	if !e.Submit(req, l.content) {
		l.rec.Rejected(req.ID)
		err := l.router.PrefillDone(ctx, req, i)
		if f, ok := l.router.(router.Finisher); ok {
			f.Finished(req, i)
		}
		return err
	}
	l.rec.Routed(i)
	if !e.InStep() {
		return l.startStep(i, now)
	}
	return nil
}

func (l *loop) startStep(i int, now time.Duration) error {
	e := l.fleet.engines[i]
	d, ok := e.StartStep(now)
	if !ok {
		if !e.Idle() {
			return fmt.Errorf("sim: engine %d has queued requests but could not schedule a step", i)
		}
		return nil
	}
	l.schedule(simEvent{t: now + d, kind: evStepEnd, engine: int32(i)})
	return nil
}

func (l *loop) stepEnd(ctx context.Context, i int, now time.Duration) error {
	res := l.fleet.engines[i].FinishStep(now)
	if res.Batch != nil && l.publish != nil {
		if err := l.publish(i, res.Batch, now); err != nil {
			return err
		}
	}
	for _, ft := range res.FirstTokens {
		l.rec.FirstToken(ft.Req.ID, now, ft.Req.PromptLen, ft.CachedTokens)
		if err := l.router.PrefillDone(ctx, ft.Req, i); err != nil {
			return err
		}
	}
	f, _ := l.router.(router.Finisher)
	for _, r := range res.Finished {
		l.rec.Finished(r.ID, now, r.OutputLen)
		if f != nil {
			f.Finished(r, i)
		}
	}
	return l.startStep(i, now)
}

func (l *loop) result() metrics.Result {
	var prefill []int64
	preempt := 0
	for _, e := range l.fleet.engines {
		prefill = append(prefill, e.Stats().PrefillTokens)
		preempt += e.Stats().Preemptions
	}
	res := l.rec.Result(l.router.Name(), prefill, preempt)
	res.Note, res.IndexProblems = l.router.Note(), -1
	return res
}
