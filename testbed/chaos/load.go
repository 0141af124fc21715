package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/soak"
)

// The router's pace: a Score every scoreEvery and a Route every
// routeEvery, each to a replica drawn at random, each given callTimeout.
const (
	scoreEvery  = 40 * time.Millisecond
	routeEvery  = 150 * time.Millisecond
	callTimeout = 3 * time.Second
)

// runScores scores engines' recent prompts and cached chains on the
// replicas and checks every answer, until ctx is done.
func (r *run) runScores(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.opts.Seed, 0x73636f7265)) // "score"
	r.every(ctx, "scores", scoreEvery, func() {
		p := r.engines[rng.IntN(len(r.engines))].Prompt(rng)
		if p == nil {
			return
		}
		j := rng.IntN(len(r.replicas))
		req := &kvindexv1.ScoreRequest{Model: Model, TokenIds: p}
		if rng.IntN(4) == 0 { // every worker, flagged or not, as a candidate
			for i := range r.engines {
				req.Workers = append(req.Workers, &kvindexv1.WorkerRef{Pod: PodName(i)})
			}
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		sent := time.Now()
		resp, err := r.rclients[j].Score(cctx, req)
		if r.outcome(ctx, j, "Score", err) {
			r.check.answer(j, "Score", p, sent, time.Now(), resp)
		}
	})
}

// runRoutes routes prompts of a workload of its own (over the engines'
// system prompts) through the replicas, sends each to the chosen
// engine, checks the ranking, and releases each request 100-600 ms later,
// until ctx is done.
func (r *run) runRoutes(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.opts.Seed, 0x726f757465)) // "route"
	wl, err := soak.NewWorkload(workload, r.systems, rand.New(rand.NewPCG(r.opts.Seed, 0x776c)))
	if err != nil {
		r.harnessError("router workload: %v", err)
		return
	}
	var n atomic.Int64
	r.every(ctx, "routes", routeEvery, func() {
		p := wl.Next()
		j := rng.IntN(len(r.replicas))
		id := fmt.Sprintf("s%d-r%d", r.opts.Seed, n.Add(1))
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		sent := time.Now()
		resp, err := r.rclients[j].Route(cctx, &kvindexv1.RouteRequest{Score: &kvindexv1.ScoreRequest{Model: Model, TokenIds: p}, RequestId: id})
		if !r.outcome(ctx, j, "Route", err) {
			return
		}
		r.check.answer(j, "Route", p, sent, time.Now(), resp.GetRanking())
		i := r.podIndex(resp.GetChosen().GetPod())
		if i < 0 {
			r.violate("a", "unknown_worker", "Route from %s chose %q, which the fleet does not have", ReplicaName(j), resp.GetChosen().GetPod())
			return
		}
		r.engines[i].Submit(p)
		d := time.Duration(100+rng.IntN(500)) * time.Millisecond
		r.pending.Go(func() {
			if !sleep(ctx, d) {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			released, err := r.rclients[j].Release(cctx, id)
			if r.outcome(ctx, j, "Release", err) && !released {
				r.count("release_not_found") // the replica restarted since, or the route expired
			}
		})
	})
}

// outcome counts a call's result by replica, method and code, and
// reports whether it succeeded. Failures a fault explains (Unavailable,
// DeadlineExceeded, overload, a Route with every worker left out) are
// counted; other codes are violations: the router sends only valid
// requests.
func (r *run) outcome(ctx context.Context, j int, method string, err error) bool {
	code := status.Code(err)
	switch {
	case err == nil:
		r.count("rpc_ok")
		return true
	case ctx.Err() != nil:
	case code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled:
		r.count("rpc_" + strings.ToLower(code.String()))
	case code == codes.ResourceExhausted && api.IsOverloaded(err):
		r.count("rpc_overloaded")
	case code == codes.FailedPrecondition && method == "Route":
		// Every worker is left out (STALE): there is nowhere to route.
		r.count("route_no_worker")
	case code == codes.InvalidArgument && method == "Score" && strings.Contains(err.Error(), "unknown worker"):
		// A candidate whose registration is gone (its agent stopped, or
		// expired): the replica no longer has the worker.
		r.count("score_unknown_candidate")
	default:
		r.violate("a", "rpc_error", "%s on %s: %v", method, ReplicaName(j), err)
	}
	return false
}

// every calls f every d until ctx is done, beating the harness watchdog
// as loop name.
func (r *run) every(ctx context.Context, name string, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	defer r.beats.done(name)
	for {
		r.beats.beat(name, 30*time.Second)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
