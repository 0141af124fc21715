package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// The load sends Score, Route and Release calls at fixed rates through
// the runner's api.Client and checks every answer: no error but a
// restart's, only configured workers (of the request's model), matched
// blocks within the prompt, tokens equal to blocks times the block size,
// a speculative part within the match, Route's pick among its ranking.
// It counts in runner.load (Summary.Load lists the names).

// prompt returns a prompt for the load, and its model: an engine's recent
// prompt as is, cut at a random length, extended, or with one token
// changed, so that answers of every length occur.
func (r *runner) prompt(rng *rand.Rand) ([]uint32, string) {
	e := r.engines[rng.IntN(len(r.engines))]
	p := e.Prompt(rng)
	model := e.Spec().Model
	if len(p) == 0 {
		return randomTokens(rng, 64), model
	}
	if k := rng.IntN(4); k > 0 {
		_, p = vary(rng, p, k-1, 200)
	}
	return p, model
}

// vary returns a new prompt made from p, and how: by kind 0 cut at a
// random length, 1 extended by up to ext random tokens, 2 with one token
// changed.
func vary(rng *rand.Rand, p []uint32, kind, ext int) (string, []uint32) {
	switch kind {
	case 0:
		return "cut", p[:1+rng.IntN(len(p))]
	case 1:
		return "extended", append(append([]uint32(nil), p...), randomTokens(rng, 1+rng.IntN(ext))...)
	}
	q := append([]uint32(nil), p...)
	q[rng.IntN(len(q))] ^= 1
	return "changed", q
}

// call runs one RPC with a deadline and reports whether it succeeded,
// counting an overload refusal or a restart's error, and recording any
// other as a failure of kind.
func (r *runner) call(ctx context.Context, kind, what string, do func(context.Context) error) bool {
	r.load.add("calls")
	mark := r.window.Mark()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := do(cctx)
	cancel()
	if err == nil {
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	code := codes.Unknown
	if st, ok := api.ServerStatus(err); ok {
		code = st.Code()
	}
	switch {
	case api.IsOverloaded(err):
		r.load.add("refused")
	case r.window.Overlaps(mark) && (code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled):
		r.load.add("restart_errors")
	default:
		r.fail.Add(kind, "%s outside a daemon restart: %v", what, err)
	}
	return false
}

// runScores sends Score calls at scoreRPS until ctx is done; one in
// twenty is a deliberately invalid request.
func (r *runner) runScores(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.opts.Seed, stringSeed("scores")))
	every(ctx, time.Second/scoreRPS, func(i int) {
		if i%20 == 19 {
			r.invalidScore(ctx, rng)
			return
		}
		toks, model := r.prompt(rng)
		proc := r.Process()
		req := &kvindexv1.ScoreRequest{Model: model, TokenIds: toks}
		if rng.IntN(4) == 0 {
			for _, w := range r.models[model] {
				if w.Pod != PushPod { // the push worker exists only once its engine has sent
					req.Workers = append(req.Workers, &kvindexv1.WorkerRef{Pod: w.Pod, DpRank: uint32(w.DPRank)})
				}
			}
		}
		var resp *kvindexv1.ScoreResponse
		if r.call(ctx, "rpc_error", "Score", func(c context.Context) (err error) {
			resp, err = r.client.Score(c, req)
			return err
		}) {
			r.load.add("scores")
			r.checkScore("Score", req, resp)
			r.checkSettled("Score", resp, proc)
		}
	})
}

// invalidScore sends a request the server must refuse (InvalidArgument).
func (r *runner) invalidScore(ctx context.Context, rng *rand.Rand) {
	toks := randomTokens(rng, 64)
	reqs := []*kvindexv1.ScoreRequest{
		{Model: "soak/unknown-model", TokenIds: toks},
		{TokenIds: toks},
		{Model: ModelA, TokenIds: toks, BlockKeys: []uint64{1, 2}},
		{Model: ModelA, TokenIds: toks, Workers: []*kvindexv1.WorkerRef{{Pod: "pod-nonexistent"}}},
		{Model: ModelA, TokenIds: toks, Workers: []*kvindexv1.WorkerRef{{Pod: "pod-c"}}}, // another model's
		{Model: ModelA},
	}
	req := reqs[rng.IntN(len(reqs))]
	what := fmt.Sprintf("invalid Score (model %q, %d tokens, %d keys, %d candidates)", req.GetModel(), len(req.GetTokenIds()), len(req.GetBlockKeys()), len(req.GetWorkers()))
	if r.call(ctx, "invalid_accepted", what, func(c context.Context) error {
		_, err := r.client.Score(c, req)
		if st, ok := api.ServerStatus(err); ok && st.Code() == codes.InvalidArgument {
			return nil
		} else if err == nil {
			return errors.New("answered OK, want InvalidArgument")
		}
		return fmt.Errorf("%w, want InvalidArgument", err)
	}) {
		r.load.add("invalid")
	}
}

// checkScore checks one answer's sanity against its request.
func (r *runner) checkScore(what string, req *kvindexv1.ScoreRequest, resp *kvindexv1.ScoreResponse) {
	bs := BlockSizeOf(req.GetModel())
	blocks := len(req.GetTokenIds()) / bs
	if len(req.GetBlockKeys()) > 0 {
		blocks = len(req.GetBlockKeys())
	}
	if int(resp.GetBlockSize()) != bs || int(resp.GetPromptBlocks()) != blocks {
		r.fail.Add("insane_answer", "%s model %s: block_size %d prompt_blocks %d, want %d and %d", what, req.GetModel(), resp.GetBlockSize(), resp.GetPromptBlocks(), bs, blocks)
	}
	seen := map[events.WorkerRef]bool{}
	for _, w := range resp.GetWorkers() {
		ref := refOf(w)
		r.load.add("health " + w.GetHealth().String())
		if !r.servesModel(ref, req.GetModel()) {
			r.fail.Add("unknown_worker", "%s model %s names worker %s, which is not a configured worker of the model", what, req.GetModel(), ref)
			continue
		}
		if seen[ref] {
			r.fail.Add("insane_answer", "%s names worker %s twice", what, ref)
		}
		seen[ref] = true
		m := int(w.GetMatchedBlocks())
		switch {
		case m > blocks:
			r.fail.Add("insane_answer", "%s worker %s matched %d blocks of a %d-block prompt", what, ref, m, blocks)
		case int(w.GetMatchedTokens()) != m*bs:
			r.fail.Add("insane_answer", "%s worker %s matched %d blocks but %d tokens (block size %d)", what, ref, m, w.GetMatchedTokens(), bs)
		case int(w.GetSpeculativeBlocks()) > m:
			r.fail.Add("insane_answer", "%s worker %s: %d speculative of %d matched blocks", what, ref, w.GetSpeculativeBlocks(), m)
		}
		switch w.GetHealth() {
		case kvindexv1.WorkerHealth_WORKER_HEALTH_STALE, kvindexv1.WorkerHealth_WORKER_HEALTH_CONFLICT, kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED:
			if len(req.GetWorkers()) == 0 {
				r.fail.Add("unhealthy_worker", "%s names worker %s with health %v (no engine of the soak ever goes stale, conflicts or loses events beyond replay)", what, ref, w.GetHealth())
			}
		}
		for _, bm := range w.GetByMedium() {
			if bm.GetMedium() != "GPU" || int(bm.GetBlocks()) > m || int(bm.GetTokens()) != int(bm.GetBlocks())*bs {
				r.fail.Add("insane_answer", "%s worker %s medium %s: %d blocks %d tokens (matched %d, block size %d; engines store on GPU only)", what, ref, bm.GetMedium(), bm.GetBlocks(), bm.GetTokens(), m, bs)
			}
		}
	}
	for _, c := range req.GetWorkers() {
		if !seen[events.WorkerRef{Pod: c.GetPod(), DPRank: int(c.GetDpRank())}] {
			r.fail.Add("insane_answer", "%s left out candidate %s/%d", what, c.GetPod(), c.GetDpRank())
		}
	}
}

func (r *runner) servesModel(ref events.WorkerRef, model string) bool {
	e := r.byRef[ref]
	return e != nil && e.Spec().Model == model
}

// checkSettled fails an answer of a settled daemon process (proc, the
// one asked) that names a DEGRADED worker: once a process has relearned
// the caches, no event of the soak's engines fails to decode or apply.
func (r *runner) checkSettled(what string, resp *kvindexv1.ScoreResponse, proc int) {
	if proc != r.Process() || !r.Settled(proc) {
		return
	}
	for _, w := range resp.GetWorkers() {
		if w.GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_DEGRADED {
			r.fail.Add("unhealthy_worker", "%s names worker %s DEGRADED in daemon process %d, after a checkpoint passed", what, refOf(w), proc)
		}
	}
}

// release is a routed request waiting for its Release.
type release struct {
	id          string
	routed, due time.Time
	gen         int // daemon process that routed it
}

// runRoutes sends Route calls at routeRPS until ctx is done and releases
// each routed request 0-500 ms later, except one in twenty, left to
// expire (scoring.inflight_ttl).
func (r *runner) runRoutes(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.opts.Seed, stringSeed("routes")))
	var pending []release
	every(ctx, time.Second/routeRPS, func(i int) {
		now := time.Now()
		for len(pending) > 0 && !pending[0].due.After(now) {
			r.release(ctx, pending[0])
			pending = pending[1:]
		}
		toks, model := r.prompt(rng)
		id := "soak-" + strconv.FormatUint(r.opts.Seed, 10) + "-" + strconv.Itoa(i)
		req := &kvindexv1.RouteRequest{Score: &kvindexv1.ScoreRequest{Model: model, TokenIds: toks}, RequestId: id}
		var pick events.WorkerRef
		if rng.IntN(4) == 0 {
			ws := r.models[model]
			pick = ws[rng.IntN(len(ws))]
			if pick.Pod == PushPod {
				pick = ws[0]
			}
			req.Pick = &kvindexv1.WorkerRef{Pod: pick.Pod, DpRank: uint32(pick.DPRank)}
		}
		gen := r.Process()
		var resp *kvindexv1.RouteResponse
		if !r.call(ctx, "rpc_error", "Route", func(c context.Context) (err error) {
			resp, err = r.client.Route(c, req)
			return err
		}) {
			return
		}
		r.load.add("routes")
		r.checkRoute(req, resp, pick)
		r.checkSettled("Route", resp.GetRanking(), gen)
		if rng.IntN(20) != 0 {
			pending = append(pending, release{id: id, routed: now, due: now.Add(time.Duration(rng.IntN(500)) * time.Millisecond), gen: gen})
			// Keep pending in due order (due times are close; insertion is short).
			for j := len(pending) - 1; j > 0 && pending[j].due.Before(pending[j-1].due); j-- {
				pending[j], pending[j-1] = pending[j-1], pending[j]
			}
		}
	})
}

func (r *runner) checkRoute(req *kvindexv1.RouteRequest, resp *kvindexv1.RouteResponse, pick events.WorkerRef) {
	r.checkScore("Route", req.GetScore(), resp.GetRanking())
	chosen := events.WorkerRef{Pod: resp.GetChosen().GetPod(), DPRank: int(resp.GetChosen().GetDpRank())}
	if !r.servesModel(chosen, req.GetScore().GetModel()) {
		r.fail.Add("unknown_worker", "Route %s chose %s, not a configured worker of model %s", req.GetRequestId(), chosen, req.GetScore().GetModel())
	}
	if pick.Pod != "" && chosen != pick {
		r.fail.Add("insane_answer", "Route %s picked %s but recorded %s", req.GetRequestId(), pick, chosen)
	}
	ranked := map[events.WorkerRef]bool{}
	for _, w := range resp.GetRanking().GetWorkers() {
		ranked[refOf(w)] = true
	}
	if !ranked[chosen] {
		r.fail.Add("insane_answer", "Route %s chose %s, which its ranking does not list", req.GetRequestId(), chosen)
	}
	for _, w := range r.models[req.GetScore().GetModel()] {
		if w.Pod != PushPod && !ranked[w] {
			r.fail.Add("insane_answer", "Route %s ranking leaves out worker %s (Route ranks every worker of the model that is not stale)", req.GetRequestId(), w)
		}
	}
}

func (r *runner) release(ctx context.Context, rel release) {
	var released bool
	if !r.call(ctx, "rpc_error", "Release", func(c context.Context) (err error) {
		released, err = r.client.Release(c, rel.id)
		return err
	}) {
		return
	}
	r.load.add("releases")
	switch {
	case released:
	case rel.gen != r.Process():
		r.load.add("released_false")
	default:
		r.fail.Add("release_lost", "Release %s: not in flight, though this daemon process routed it %v ago (inflight_ttl %v)", rel.id, time.Since(rel.routed).Round(time.Millisecond), InflightTTL)
	}
}

// checkpointTries bounds how many times a checkpoint Score refused for
// overload is sent (about 3 s with retryOverloaded's backoff).
const checkpointTries = 10

// retryOverloaded runs do until it returns anything but an overload
// refusal, at most checkpointTries times, backing off from 25 ms (doubling,
// at most 400 ms) and counting each refusal; it returns do's last error.
func (r *runner) retryOverloaded(ctx context.Context, do func() error) error {
	wait := 25 * time.Millisecond
	for try := 1; ; try++ {
		err := do()
		if !api.IsOverloaded(err) || try == checkpointTries {
			return err
		}
		r.load.add("checkpoint_refused")
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(2*wait, 400*time.Millisecond)
	}
}
