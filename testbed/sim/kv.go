package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim/router"
)

// localKV is kvindex in process for one precise router: the scorer the
// gRPC server answers with, without protobuf.
type localKV struct {
	s      *scoring.Scorer
	req    scoring.Request
	res    scoring.Result
	loads  []scoring.RequestLoad
	pol    scoring.Policy
	polFor *scoring.Override // the override pol was built from
	routed int               // the chosen worker's matched tokens in the last Route
	// est is the chosen worker's estimated TTFT in the last Route, when
	// estOK (its policy is cache_aware with the ttft guard).
	est   time.Duration
	estOK bool
}

func (k *localKV) request(q *router.Query) error {
	m, ok := k.s.Index().Model(q.Model)
	if !ok {
		return fmt.Errorf("sim: kvindex: unknown model %q", q.Model)
	}
	k.req = scoring.Request{Model: m, Tokens: q.Tokens}
	k.loads = k.loads[:0]
	for _, l := range q.Loads {
		k.loads = append(k.loads, scoring.RequestLoad{Worker: events.WorkerRef{Pod: l.Pod}, Running: l.Running, Waiting: l.Waiting, KVUsage: l.KVUsage})
	}
	k.req.Loads = k.loads
	if q.Policy != nil {
		if q.Policy != k.polFor {
			pol, err := q.Policy.Apply(k.s.Policy())
			if err != nil {
				return fmt.Errorf("sim: kvindex: policy.%w", err)
			}
			k.pol, k.polFor = pol, q.Policy
		}
		k.req.Policy = &k.pol
		k.req.All = true
	}
	return nil
}

func (k *localKV) Score(_ context.Context, q *router.Query, visit func(string, int)) error {
	if err := k.request(q); err != nil {
		return err
	}
	if err := k.s.Score(&k.req, &k.res); err != nil {
		return err
	}
	bs := k.res.Model.BlockSize()
	for i := range k.res.Ranked {
		c := &k.res.Ranked[i]
		visit(c.Ref.Pod, c.Match.Blocks*bs)
	}
	return nil
}

func (k *localKV) Route(_ context.Context, id string, q *router.Query) (string, error) {
	if err := k.request(q); err != nil {
		return "", err
	}
	i, err := k.s.Route(id, "", &k.req, nil, &k.res)
	if err != nil {
		return "", err
	}
	c := &k.res.Ranked[i]
	k.routed = c.Match.Blocks * k.res.Model.BlockSize()
	k.estOK = k.res.Policy.Name == scoring.CacheAware && k.res.Policy.Guard == scoring.GuardTTFT
	k.est = time.Duration(c.Est.TTFT() * float64(time.Second))
	return c.Ref.Pod, nil
}

// RouteEstimate implements router.RouteEstimator (over gRPC the answer
// carries scores, not the estimate).
func (k *localKV) RouteEstimate() (time.Duration, bool) { return k.est, k.estOK }

// RouteMatched implements router.RouteMatcher.
func (k *localKV) RouteMatched() int { return k.routed }

func (k *localKV) Release(_ context.Context, id string) error {
	_, err := k.s.Release(id, "")
	return err
}

// grpcKV is kvindex over gRPC for one precise router (live mode).
type grpcKV struct {
	c      *api.Client
	routed int // the chosen worker's matched tokens in the last Route
}

func (g *grpcKV) scoreRequest(q *router.Query) *kvindexv1.ScoreRequest {
	req := &kvindexv1.ScoreRequest{Model: q.Model, TokenIds: q.Tokens}
	for _, l := range q.Loads {
		req.Loads = append(req.Loads, &kvindexv1.WorkerLoad{Worker: &kvindexv1.WorkerRef{Pod: l.Pod}, Running: l.Running,
			Waiting: l.Waiting, KvCacheUsage: l.KVUsage})
	}
	if p := q.Policy; p != nil {
		req.Policy = &kvindexv1.ScorePolicy{Name: p.Name, Guard: p.Guard, LoadWeight: p.LoadWeight, StaticK: p.StaticK,
			GpuWeight: p.GPUWeight, CpuWeight: p.CPUWeight, StorageWeight: p.StorageWeight}
	}
	return req
}

func (g *grpcKV) Score(ctx context.Context, q *router.Query, visit func(string, int)) error {
	resp, err := g.c.Score(ctx, g.scoreRequest(q))
	if err != nil {
		return err
	}
	for _, ws := range resp.GetWorkers() {
		visit(ws.GetWorker().GetPod(), int(ws.GetMatchedTokens()))
	}
	return nil
}

func (g *grpcKV) Route(ctx context.Context, id string, q *router.Query) (string, error) {
	resp, err := g.c.Route(ctx, &kvindexv1.RouteRequest{Score: g.scoreRequest(q), RequestId: id})
	if err != nil {
		return "", err
	}
	pod := resp.GetChosen().GetPod()
	g.routed = 0
	for _, ws := range resp.GetRanking().GetWorkers() {
		if ws.GetWorker().GetPod() == pod {
			g.routed = int(ws.GetMatchedTokens())
			break
		}
	}
	return pod, nil
}

// RouteMatched implements router.RouteMatcher.
func (g *grpcKV) RouteMatched() int { return g.routed }

func (g *grpcKV) Release(ctx context.Context, id string) error {
	_, err := g.c.Release(ctx, id)
	return err
}
