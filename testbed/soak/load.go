package soak

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// LoadStats count the gRPC load and what its checks saw.
type LoadStats struct {
	// Scores and Routes are answered calls; Releases answered Releases,
	// ReleasedFalse those that found the request gone after a daemon
	// restart (its in-flight table died with the process).
	Scores, Routes, Releases, ReleasedFalse int64
	// Invalid is deliberately invalid requests refused with
	// InvalidArgument.
	Invalid int64
	// RestartErrors are calls that failed during a daemon restart with a
	// code a restart causes.
	RestartErrors int64
	// Calls counts the Score and Route calls sent, invalid ones included;
	// Refused those the daemon's admission control refused for overload
	// (api.IsOverloaded), which are neither answers nor failures unless
	// there are more than Options.MaxRefused of Calls.
	Calls, Refused int64
	// CheckpointRefused counts checkpoint Scores refused for overload and
	// sent again (a checkpoint compares every answer it needs).
	CheckpointRefused int64
	// Health counts the workers in answers by health.
	Health map[string]int64
}

// Load sends Score, Route and Release calls at fixed rates through one
// api.Client and checks every answer: no error but a restart's, only
// configured workers (of the request's model), matched blocks within
// the prompt, tokens equal to blocks times the block size, a speculative
// part within the match, Route's pick among its ranking.
//
// # Concurrency
//
// Score and Route run on their own goroutines (RunScores, RunRoutes);
// Stats may be called from any goroutine.
type Load struct {
	client  *api.Client
	workers map[string][]events.WorkerRef
	legit   map[events.WorkerRef]string // worker -> model
	engines []*Engine
	window  *Window
	view    LoadView
	fail    *Failures
	seed    uint64

	scores, routes, releases, releasedFalse, invalid, restartErrs atomic.Int64
	calls, refused, checkRefused                                  atomic.Int64
	mu                                                            sync.Mutex
	health                                                        map[string]int64
}

// LoadView is what the load knows of the daemon.
type LoadView interface {
	// Process returns the current daemon process's number.
	Process() int
	// Settled reports whether a checkpoint of process n has passed: its
	// join replays are over, and no worker may be DEGRADED any more.
	Settled(n int) bool
}

// NewLoad returns the load over client for fleet's workers, drawing
// prompts from engines.
func NewLoad(client *api.Client, f *Fleet, engines []*Engine, window *Window, view LoadView, fail *Failures, seed uint64) *Load {
	l := &Load{client: client, workers: f.Workers(), legit: map[events.WorkerRef]string{}, engines: engines, window: window, view: view, fail: fail, seed: seed, health: map[string]int64{}}
	for m, ws := range l.workers {
		for _, w := range ws {
			l.legit[w] = m
		}
	}
	return l
}

// Stats returns the counters so far.
func (l *Load) Stats() LoadStats {
	l.mu.Lock()
	h := maps.Clone(l.health)
	l.mu.Unlock()
	return LoadStats{Scores: l.scores.Load(), Routes: l.routes.Load(), Releases: l.releases.Load(), ReleasedFalse: l.releasedFalse.Load(), Invalid: l.invalid.Load(), RestartErrors: l.restartErrs.Load(), Calls: l.calls.Load(), Refused: l.refused.Load(), CheckpointRefused: l.checkRefused.Load(), Health: h}
}

// prompt returns a prompt for the load, and its model: an engine's recent
// prompt as is, cut at a random length, extended, or with one token
// changed, so that answers of every length occur.
func (l *Load) prompt(rng *rand.Rand) ([]uint32, string) {
	e := l.engines[rng.IntN(len(l.engines))]
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

// call runs one RPC with a deadline and classifies its error: nil, an
// overload refusal or a restart's (counted), or a failure (recorded). It
// reports whether the call succeeded.
func (l *Load) call(ctx context.Context, what string, do func(context.Context) error) bool {
	l.calls.Add(1)
	mark := l.window.Mark()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := do(cctx)
	cancel()
	if err == nil {
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	if api.IsOverloaded(err) {
		l.refused.Add(1)
		return false
	}
	code := codes.Unknown
	if st, ok := api.ServerStatus(err); ok {
		code = st.Code()
	}
	if l.window.Overlaps(mark) && (code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled) {
		l.restartErrs.Add(1)
		return false
	}
	l.fail.Add("rpc_error", "%s outside a daemon restart: %v", what, err)
	return false
}

// RunScores sends Score calls at rps until ctx is done; one in twenty is
// a deliberately invalid request.
func (l *Load) RunScores(ctx context.Context, rps float64) {
	rng := rand.New(rand.NewPCG(l.seed, stringSeed("scores")))
	every(ctx, time.Duration(float64(time.Second)/rps), func(i int) bool {
		if i%20 == 19 {
			l.invalidScore(ctx, rng)
			return true
		}
		toks, model := l.prompt(rng)
		proc := l.view.Process()
		req := &kvindexv1.ScoreRequest{Model: model, TokenIds: toks}
		if rng.IntN(4) == 0 {
			for _, w := range l.workers[model] {
				if w.Pod != PushPod { // the push worker exists only once its engine has sent
					req.Workers = append(req.Workers, &kvindexv1.WorkerRef{Pod: w.Pod, DpRank: uint32(w.DPRank)})
				}
			}
		}
		var resp *kvindexv1.ScoreResponse
		if !l.call(ctx, "Score", func(c context.Context) error {
			var err error
			resp, err = l.client.Score(c, req)
			return err
		}) {
			return true
		}
		l.scores.Add(1)
		l.checkScore("Score", req, resp)
		l.checkSettled("Score", resp, proc)
		return true
	})
}

// invalidScore sends a request the server must refuse with
// InvalidArgument.
func (l *Load) invalidScore(ctx context.Context, rng *rand.Rand) {
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
	l.calls.Add(1)
	mark := l.window.Mark()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := l.client.Score(cctx, req)
	cancel()
	if ctx.Err() != nil {
		return
	}
	code := codes.OK
	if st, ok := api.ServerStatus(err); ok {
		code = st.Code()
	}
	switch {
	case code == codes.InvalidArgument:
		l.invalid.Add(1)
	case api.IsOverloaded(err): // refused before it was read
		l.refused.Add(1)
	case l.window.Overlaps(mark) && (code == codes.Unavailable || code == codes.DeadlineExceeded):
		l.restartErrs.Add(1)
	default:
		l.fail.Add("invalid_accepted", "invalid Score (model %q, %d tokens, %d keys, %d candidates) answered %v (%v), want InvalidArgument", req.GetModel(), len(req.GetTokenIds()), len(req.GetBlockKeys()), len(req.GetWorkers()), code, err)
	}
}

// checkScore checks one answer's sanity against its request.
func (l *Load) checkScore(what string, req *kvindexv1.ScoreRequest, resp *kvindexv1.ScoreResponse) {
	bs := BlockSizeOf(req.GetModel())
	blocks := len(req.GetTokenIds()) / bs
	if len(req.GetBlockKeys()) > 0 {
		blocks = len(req.GetBlockKeys())
	}
	if int(resp.GetBlockSize()) != bs || int(resp.GetPromptBlocks()) != blocks {
		l.fail.Add("insane_answer", "%s model %s: block_size %d prompt_blocks %d, want %d and %d", what, req.GetModel(), resp.GetBlockSize(), resp.GetPromptBlocks(), bs, blocks)
	}
	seen := map[events.WorkerRef]bool{}
	for _, w := range resp.GetWorkers() {
		ref := refOf(w)
		l.mu.Lock()
		l.health[w.GetHealth().String()]++
		l.mu.Unlock()
		if m, ok := l.legit[ref]; !ok || m != req.GetModel() {
			l.fail.Add("unknown_worker", "%s model %s names worker %s, which is not a configured worker of the model", what, req.GetModel(), ref)
			continue
		}
		if seen[ref] {
			l.fail.Add("insane_answer", "%s names worker %s twice", what, ref)
		}
		seen[ref] = true
		m := int(w.GetMatchedBlocks())
		switch {
		case m > blocks:
			l.fail.Add("insane_answer", "%s worker %s matched %d blocks of a %d-block prompt", what, ref, m, blocks)
		case int(w.GetMatchedTokens()) != m*bs:
			l.fail.Add("insane_answer", "%s worker %s matched %d blocks but %d tokens (block size %d)", what, ref, m, w.GetMatchedTokens(), bs)
		case int(w.GetSpeculativeBlocks()) > m:
			l.fail.Add("insane_answer", "%s worker %s: %d speculative of %d matched blocks", what, ref, w.GetSpeculativeBlocks(), m)
		}
		switch w.GetHealth() {
		case kvindexv1.WorkerHealth_WORKER_HEALTH_STALE, kvindexv1.WorkerHealth_WORKER_HEALTH_CONFLICT, kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED:
			if len(req.GetWorkers()) == 0 {
				l.fail.Add("unhealthy_worker", "%s names worker %s with health %v (no engine of the soak ever goes stale, conflicts or loses events beyond replay)", what, ref, w.GetHealth())
			}
		}
		for _, bm := range w.GetByMedium() {
			if bm.GetMedium() != "GPU" || int(bm.GetBlocks()) > m || int(bm.GetTokens()) != int(bm.GetBlocks())*bs {
				l.fail.Add("insane_answer", "%s worker %s medium %s: %d blocks %d tokens (matched %d, block size %d; engines store on GPU only)", what, ref, bm.GetMedium(), bm.GetBlocks(), bm.GetTokens(), m, bs)
			}
		}
	}
	for _, c := range req.GetWorkers() {
		if !seen[events.WorkerRef{Pod: c.GetPod(), DPRank: int(c.GetDpRank())}] {
			l.fail.Add("insane_answer", "%s left out candidate %s/%d", what, c.GetPod(), c.GetDpRank())
		}
	}
}

// checkSettled fails an answer of a settled daemon process (proc, the
// one asked) that names a DEGRADED worker: once a process has relearned
// the caches, no event of the soak's engines fails to decode or apply.
func (l *Load) checkSettled(what string, resp *kvindexv1.ScoreResponse, proc int) {
	if proc != l.view.Process() || !l.view.Settled(proc) {
		return
	}
	for _, w := range resp.GetWorkers() {
		if w.GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_DEGRADED {
			l.fail.Add("unhealthy_worker", "%s names worker %s DEGRADED in daemon process %d, after a checkpoint passed", what, refOf(w), proc)
		}
	}
}

// release is a routed request waiting for its Release.
type release struct {
	id     string
	routed time.Time
	due    time.Time
	gen    int // daemon process that routed it
}

// RunRoutes sends Route calls at rps until ctx is done and releases each
// routed request 0-500 ms later, except one in twenty, left to expire
// (scoring.inflight_ttl).
func (l *Load) RunRoutes(ctx context.Context, rps float64) {
	rng := rand.New(rand.NewPCG(l.seed, stringSeed("routes")))
	var pending []release
	every(ctx, time.Duration(float64(time.Second)/rps), func(i int) bool {
		now := time.Now()
		for len(pending) > 0 && !pending[0].due.After(now) {
			l.release(ctx, pending[0])
			pending = pending[1:]
		}
		toks, model := l.prompt(rng)
		id := "soak-" + strconv.FormatUint(l.seed, 10) + "-" + strconv.Itoa(i)
		req := &kvindexv1.RouteRequest{Score: &kvindexv1.ScoreRequest{Model: model, TokenIds: toks}, RequestId: id}
		var pick events.WorkerRef
		if rng.IntN(4) == 0 {
			ws := l.workers[model]
			pick = ws[rng.IntN(len(ws))]
			if pick.Pod == PushPod {
				pick = ws[0]
			}
			req.Pick = &kvindexv1.WorkerRef{Pod: pick.Pod, DpRank: uint32(pick.DPRank)}
		}
		gen := l.view.Process()
		var resp *kvindexv1.RouteResponse
		if !l.call(ctx, "Route", func(c context.Context) error {
			var err error
			resp, err = l.client.Route(c, req)
			return err
		}) {
			return true
		}
		l.routes.Add(1)
		l.checkRoute(req, resp, pick)
		l.checkSettled("Route", resp.GetRanking(), gen)
		if rng.IntN(20) != 0 {
			pending = append(pending, release{id: id, routed: now, due: now.Add(time.Duration(rng.IntN(500)) * time.Millisecond), gen: gen})
			// Keep pending in due order (due times are close; insertion is short).
			for j := len(pending) - 1; j > 0 && pending[j].due.Before(pending[j-1].due); j-- {
				pending[j], pending[j-1] = pending[j-1], pending[j]
			}
		}
		return true
	})
}

func (l *Load) checkRoute(req *kvindexv1.RouteRequest, resp *kvindexv1.RouteResponse, pick events.WorkerRef) {
	l.checkScore("Route", req.GetScore(), resp.GetRanking())
	chosen := events.WorkerRef{Pod: resp.GetChosen().GetPod(), DPRank: int(resp.GetChosen().GetDpRank())}
	if m, ok := l.legit[chosen]; !ok || m != req.GetScore().GetModel() {
		l.fail.Add("unknown_worker", "Route %s chose %s, not a configured worker of model %s", req.GetRequestId(), chosen, req.GetScore().GetModel())
	}
	if pick.Pod != "" && chosen != pick {
		l.fail.Add("insane_answer", "Route %s picked %s but recorded %s", req.GetRequestId(), pick, chosen)
	}
	in := false
	ranked := map[events.WorkerRef]bool{}
	for _, w := range resp.GetRanking().GetWorkers() {
		ref := refOf(w)
		ranked[ref] = true
		in = in || ref == chosen
	}
	if !in {
		l.fail.Add("insane_answer", "Route %s chose %s, which its ranking does not list", req.GetRequestId(), chosen)
	}
	for _, w := range l.workers[req.GetScore().GetModel()] {
		if w.Pod != PushPod && !ranked[w] {
			l.fail.Add("insane_answer", "Route %s ranking leaves out worker %s (Route ranks every worker of the model that is not stale)", req.GetRequestId(), w)
		}
	}
}

func (l *Load) release(ctx context.Context, r release) {
	var released bool
	if !l.call(ctx, "Release", func(c context.Context) error {
		var err error
		released, err = l.client.Release(c, r.id)
		return err
	}) {
		return
	}
	l.releases.Add(1)
	if released {
		return
	}
	if r.gen != l.view.Process() {
		l.releasedFalse.Add(1)
		return
	}
	l.fail.Add("release_lost", "Release %s: not in flight, though this daemon process routed it %v ago (inflight_ttl %v)", r.id, time.Since(r.routed).Round(time.Millisecond), InflightTTL)
}

// ScoreByKeys scores tokens as client-side block keys
// (indexer.Model.PromptKeys), for comparison with the token answer.
func ScoreByKeys(ctx context.Context, client *api.Client, model string, tokens []uint32) (*kvindexv1.ScoreResponse, error) {
	m, err := indexer.NewModel(model, BlockSizeOf(model))
	if err != nil {
		return nil, err
	}
	keys := m.PromptKeys(tokens, nil, nil)
	if len(keys) == 0 {
		return nil, fmt.Errorf("soak: prompt of %d tokens has no full block", len(tokens))
	}
	req := &kvindexv1.ScoreRequest{Model: model, BlockKeys: make([]uint64, len(keys))}
	for i, k := range keys {
		req.BlockKeys[i] = uint64(k)
	}
	return client.Score(ctx, req)
}

// checkpointTries bounds how many times a checkpoint Score refused for
// overload is sent; with the backoff below they span about 3 s.
const checkpointTries = 10

// retryOverloaded runs do until it returns anything but an overload
// refusal, at most checkpointTries times, backing off from 25 ms
// (doubling, at most 400 ms) and counting each refusal; it returns do's
// last error.
func (l *Load) retryOverloaded(ctx context.Context, do func() error) error {
	wait := 25 * time.Millisecond
	for try := 1; ; try++ {
		err := do()
		if !api.IsOverloaded(err) || try == checkpointTries {
			return err
		}
		l.checkRefused.Add(1)
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(2*wait, 400*time.Millisecond)
	}
}
