package router

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// precise asks kvindex: precise and precise+load (see the package doc).
type precise struct {
	name  string
	f     Fleet
	kv    KV
	model string
	byPod map[string]int
	next  int

	// client: rank client-side (ModeClient), said in note.
	client bool
	note   string
	policy *scoring.Override
	// inflight[i] is the uncached prefill tokens the client ranking routed
	// to engine i and not yet prefilled; pending[id] what request id added.
	inflight []int64
	pending  map[int]pendingRoute

	// pred is kvindex's match on the engine the last Route chose, when
	// predOK (Predictor).
	pred   int
	predOK bool
	// est is kvindex's estimated TTFT on that engine, when estOK
	// (Estimator).
	est   time.Duration
	estOK bool

	q       Query
	matched []int
	loads   []PodLoad
	visit   func(pod string, tokens int) // p.record, bound once
	bad     string                       // a pod kvindex named that is not the fleet's
}

type pendingRoute struct {
	engine int
	tokens int64
}

func newPrecise(name string, cfg Config) *precise {
	n := cfg.Fleet.Engines()
	p := &precise{
		name: name, f: cfg.Fleet, kv: cfg.KV, model: cfg.Model,
		byPod: make(map[string]int, n), inflight: make([]int64, n),
		pending: make(map[int]pendingRoute), matched: make([]int, n), policy: cfg.RoutePolicy,
		loads: make([]PodLoad, n),
	}
	if name == PreciseLoad && cfg.PreciseLoadMode == ModeClient {
		p.client = true
		p.note = "client-side cost: Score + the router's own in-flight prefill, ties by load (kvindex Route not used)"
	}
	for i, pod := range cfg.Names {
		p.byPod[pod] = i
		p.loads[i].Pod = pod
	}
	p.visit = p.record
	return p
}

func (p *precise) record(pod string, tokens int) {
	i, ok := p.byPod[pod]
	if !ok {
		p.bad = pod
		return
	}
	p.matched[i] = tokens
}

func (p *precise) Name() string { return p.name }
func (p *precise) Note() string { return p.note }

// Predicted implements Predictor.
func (p *precise) Predicted() (int, bool) { return p.pred, p.predOK }

// Estimated implements Estimator.
func (p *precise) Estimated() (time.Duration, bool) { return p.est, p.estOK }

func (p *precise) Route(ctx context.Context, req *Request) (int, error) {
	p.q = Query{Model: p.model, Tokens: req.AppendTokens(p.q.Tokens[:0], 0, req.PromptLen)}
	p.predOK, p.estOK = false, false
	if p.name == PreciseLoad && !p.client {
		i, err := p.route(ctx, req)
		if m, ok := p.kv.(RouteMatcher); ok && err == nil {
			p.pred, p.predOK = m.RouteMatched(), true
		}
		if e, ok := p.kv.(RouteEstimator); ok && err == nil {
			p.est, p.estOK = e.RouteEstimate()
		}
		return i, err
	}
	clear(p.matched)
	p.bad = ""
	if err := p.kv.Score(ctx, &p.q, p.visit); err != nil {
		return 0, fmt.Errorf("router %s: request %d: %w", p.name, req.ID, err)
	}
	if p.bad != "" {
		return 0, fmt.Errorf("router %s: kvindex scored unknown worker %q", p.name, p.bad)
	}
	var i int
	if p.name == Precise {
		i = p.longest()
	} else {
		i = p.cheapest(req)
	}
	p.pred, p.predOK = p.matched[i], true
	return i, nil
}

// longest picks the longest match, ties by least load, then in turn.
func (p *precise) longest() int {
	top := 0
	for _, m := range p.matched {
		top = max(top, m)
	}
	i := pickLeastLoaded(p.f, p.next, func(i int) bool { return p.matched[i] == top })
	p.next = (i + 1) % len(p.matched)
	return i
}

// cheapest is the client ranking's choice, recorded: the least uncached tokens
// plus the router's in-flight prefill tokens on the engine; ties by least
// load, then in turn.
func (p *precise) cheapest(req *Request) int {
	n := len(p.matched)
	best, bestCost := -1, 0.0
	cost := func(i int) float64 {
		return float64(req.PromptLen-p.matched[i]) + float64(p.inflight[i])
	}
	for k := range n {
		i := (p.next + k) % n
		if c := cost(i); best < 0 || c < bestCost {
			best, bestCost = i, c
		}
	}
	i := pickLeastLoaded(p.f, p.next, func(i int) bool { return cost(i) == bestCost })
	p.next = (i + 1) % n
	t := int64(req.PromptLen - p.matched[i])
	p.inflight[i] += t
	p.pending[req.ID] = pendingRoute{engine: i, tokens: t}
	return i
}

// route asks kvindex's Route with the engines' loads as a router would
// scrape them.
func (p *precise) route(ctx context.Context, req *Request) (int, error) {
	for i := range p.loads {
		l := p.f.Load(i)
		p.loads[i].Running, p.loads[i].Waiting, p.loads[i].KVUsage = uint32(l.Running), uint32(l.Waiting), l.KVUsage
	}
	p.q.Loads, p.q.Policy = p.loads, p.policy
	pod, err := p.kv.Route(ctx, requestID(req.Request), &p.q)
	if err != nil {
		return 0, fmt.Errorf("router %s: request %d: %w", p.name, req.ID, err)
	}
	i, ok := p.byPod[pod]
	if !ok {
		return 0, fmt.Errorf("router %s: kvindex chose unknown worker %q", p.name, pod)
	}
	return i, nil
}

// PrefillDone releases the request: kvindex's Release, or the client
// ranking's tally.
func (p *precise) PrefillDone(ctx context.Context, req *workload.Request, _ int) error {
	if p.name != PreciseLoad {
		return nil
	}
	if p.client {
		if pr, ok := p.pending[req.ID]; ok {
			p.inflight[pr.engine] -= pr.tokens
			delete(p.pending, req.ID)
		}
		return nil
	}
	if err := p.kv.Release(ctx, requestID(req)); err != nil {
		return fmt.Errorf("router %s: release request %d: %w", p.name, req.ID, err)
	}
	return nil
}

func requestID(r *workload.Request) string { return "req-" + strconv.Itoa(r.ID) }
