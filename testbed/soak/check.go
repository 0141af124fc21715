package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// refOf returns a WorkerStatus's worker.
func refOf(w interface {
	GetWorker() *kvindexv1.WorkerRef
}) events.WorkerRef {
	return events.WorkerRef{Pod: w.GetWorker().GetPod(), DPRank: int(w.GetWorker().GetDpRank())}
}

// flushAndWait flushes engines (whose locks the caller holds) and polls
// ListWorkers until the daemon has applied each one's last seq, has
// nothing queued and is healthy; it returns the last listing. Otherwise
// it records a failure naming what (and each worker not there yet).
func (r *runner) flushAndWait(ctx context.Context, what string, engines ...*Engine) ([]*kvindexv1.WorkerStatus, bool) {
	want := map[events.WorkerRef]uint64{}
	for _, e := range engines {
		if err := e.FlushLocked(); err != nil {
			r.fail.Add("engine_error", "%v", err)
			return nil, false
		}
		want[e.Spec().Worker], _ = e.LastSeqLocked()
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		resp, err := r.client.ListWorkers(cctx, &kvindexv1.ListWorkersRequest{})
		cancel()
		var behind []string
		if err != nil {
			behind = append(behind, err.Error())
		}
		got := map[events.WorkerRef]*kvindexv1.WorkerStatus{}
		for _, w := range resp.GetWorkers() {
			got[refOf(w)] = w
		}
		for ref, seq := range want {
			w := got[ref]
			switch {
			case err != nil:
			case w != nil && w.GetHasSeq() && w.GetLastSeq() == seq && w.GetBacklog() == 0 && r.excess(ref, "unrecovered_gaps", w.GetUnrecoveredGaps(), 0) > 0:
				// The daemon gave up on some of this worker's events: it is
				// as caught up as it will get, and its health stays
				// DEGRADED or UNSYNCED for a while.
			case w == nil:
				behind = append(behind, fmt.Sprintf("%s: not listed", ref))
			case w.GetEndpoint() != r.endpointOf(ref):
				// Another listener owns the worker: it will never catch up.
				r.failLive(ctx, "not_applied", "%s: %s is served from %s, not its configured %s", what, ref, w.GetEndpoint(), r.endpointOf(ref))
				return nil, false
			case !w.GetHasSeq() || w.GetLastSeq() != seq || w.GetBacklog() != 0 || w.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_OK || w.GetModel() == "":
				behind = append(behind, fmt.Sprintf("%s: last_seq %d (has_seq %v), engine's %d, backlog %d, health %v %q", ref, w.GetLastSeq(), w.GetHasSeq(), seq, w.GetBacklog(), w.GetHealth(), w.GetHealthReason()))
			}
		}
		if len(behind) == 0 {
			return resp.GetWorkers(), true
		}
		if time.Now().After(deadline) || !sleep(ctx, 50*time.Millisecond) {
			sort.Strings(behind)
			r.failLive(ctx, "not_applied", "%s: not applied within 30s: %s", what, strings.Join(behind, "; "))
			return nil, false
		}
	}
}

// failLive records a failure unless ctx is done: the end of the run
// cuts calls short, which is no failure.
func (r *runner) failLive(ctx context.Context, kind, format string, args ...any) {
	if ctx.Err() == nil {
		r.fail.Add(kind, format, args...)
	}
}

// endpointOf returns a worker's endpoint as ListWorkers reports it.
func (r *runner) endpointOf(ref events.WorkerRef) string {
	spec := r.byRef[ref].Spec()
	if spec.Push {
		return r.fleet.AllowPushAddr()
	}
	return spec.Endpoint
}

// checkWorkerList checks that a ListWorkers answer has only the
// configured workers for the served models, at most max_workers of the
// garbage model from the open listener, and only the push pod from the
// allowlisted one.
func (r *runner) checkWorkerList(ws []*kvindexv1.WorkerStatus, when string) {
	open, allow := r.fleet.OpenPushAddr(), r.fleet.AllowPushAddr()
	nOpen := 0
	for _, w := range ws {
		ref := refOf(w)
		_, legit := r.byRef[ref]
		switch {
		case w.GetModel() == "" && w.GetEndpoint() == open:
			// A worker being created: the subscriber lists it before the
			// index does (ListWorkers says so with an empty model).
			nOpen++
		case (w.GetModel() == ModelA || w.GetModel() == ModelB) && !legit:
			r.fail.Add("injected_worker", "%s: ListWorkers lists %s (model %s, endpoint %s), which the configuration does not have: a push message created it", when, ref, w.GetModel(), w.GetEndpoint())
		case w.GetEndpoint() == open:
			nOpen++
			if w.GetModel() != GarbageModel {
				r.fail.Add("injected_worker", "%s: the open listener created %s for model %s", when, ref, w.GetModel())
			}
		case w.GetEndpoint() == allow && ref.Pod != PushPod:
			r.fail.Add("injected_worker", "%s: the allowlisted listener created %s", when, ref)
		}
	}
	if nOpen > OpenMaxWorkers {
		r.fail.Add("max_workers", "%s: the open listener created %d workers, more than its max_workers %d", when, nOpen, OpenMaxWorkers)
	}
}

// checkpoint pauses every engine, waits until the daemon has applied
// everything they sent, and compares the index with the engines' true
// caches. The caller holds chaos.
func (r *runner) checkpoint(ctx context.Context, name string) {
	for _, e := range r.engines {
		e.Lock()
	}
	defer func() {
		for _, e := range r.engines {
			e.Unlock()
		}
	}()
	t0 := time.Now()
	ws, ok := r.flushAndWait(ctx, "checkpoint "+name, r.engines...)
	if !ok {
		return
	}
	caughtUp := time.Since(t0)
	_, process := r.currentChild()
	r.record(process, ws, nil)
	r.checkWorkerList(ws, "checkpoint "+name)
	r.mu.Lock()
	restarts := maps.Clone(r.restarts)
	r.mu.Unlock()
	for _, w := range ws {
		if e := r.byRef[refOf(w)]; e != nil {
			r.checkCounters(name, w, e, restarts[refOf(w)])
			r.checkFlow(name, w, e)
		}
	}
	before, failed := r.checks.snapshot()["comparisons"], r.fail.Count()
	r.checkAnswers(ctx, name)
	r.checks.add("checkpoints")
	if r.fail.Count() == failed {
		r.mu.Lock()
		r.settled[process] = true
		r.mu.Unlock()
	}
	r.log.Info("checkpoint", "name", name, "daemon_process", process, "caught_up_in", caughtUp.Round(time.Millisecond), "comparisons", r.checks.snapshot()["comparisons"]-before, "failures", r.fail.Count())
}

// checkCounters checks one worker's ListWorkers entry against its
// engine: where it is served, its resident blocks, and counters that only
// the soak's own actions may move.
func (r *runner) checkCounters(name string, w *kvindexv1.WorkerStatus, e *Engine, restarts int) {
	spec := e.Spec()
	ref := spec.Worker
	endpoint := r.endpointOf(ref)
	bad := func(format string, args ...any) {
		r.fail.Add("worker_state", "checkpoint %s worker %s: %s", name, ref, fmt.Sprintf(format, args...))
	}
	// over reports a counter above want (plus what was already reported
	// in this daemon process) once, and says whether it did.
	over := func(counter string, got, want uint64) bool {
		x := r.excess(ref, counter, got, want)
		r.mu.Lock()
		r.reported[workerCounter{ref, counter}] += x
		r.mu.Unlock()
		return x > 0
	}
	if w.GetModel() != spec.Model || w.GetEndpoint() != endpoint {
		bad("model %q endpoint %q, want %q and %q", w.GetModel(), w.GetEndpoint(), spec.Model, endpoint)
	}
	r.checks.add("resident_checks")
	if res := e.CacheLocked().Resident(); w.GetResidentBlocks() != uint64(res) {
		bad("resident_blocks %d, the engine holds %d (physical %d); index stored %d removed %d unknown %d orphans %d apply_errors %d evictions %d clears %d resets %d batches %d replayed %d gaps %d; engine process %d steps",
			w.GetResidentBlocks(), res, e.CacheLocked().Physical(), w.GetBlocksStored(), w.GetBlocksRemoved(), w.GetUnknownBlocks(), w.GetOrphans(), w.GetApplyErrors(), w.GetEvictions(), w.GetClears(), w.GetResets(),
			w.GetBatches(), w.GetReplayedBatches(), w.GetGaps(), e.SinceRestartLocked())
	}
	for _, m := range w.GetResidentByMedium() {
		if m.GetMedium() != "GPU" || m.GetBlocks() != w.GetResidentBlocks() {
			bad("resident %d blocks in %s (engines store on GPU only, %d resident)", m.GetBlocks(), m.GetMedium(), w.GetResidentBlocks())
		}
	}
	if over("unrecovered_gaps", w.GetUnrecoveredGaps(), 0) {
		if strings.Contains(w.GetLastReset(), "replay answer skipped them") {
			r.fail.Add("replay_hole_reset", "checkpoint %s worker %s: the daemon reset the worker for seqs its engine still buffered (last_reset %q): a replay answer that lost messages at the engine's send limit and then delivered seqs at or past the first live message held was taken for a loss, not asked again", name, ref, w.GetLastReset())
		} else {
			bad("unrecovered_gaps %d, want 0: every loss of the soak's engines is still in their replay buffers (last_reset %q, last_error %q)", w.GetUnrecoveredGaps(), w.GetLastReset(), w.GetLastError())
		}
		// Make the engine clear its cache, so that the worker is exact
		// again from the next checkpoint on.
		e.ResyncLocked()
	}
	// duplicates are left out: a live message that arrives after the
	// replay answer that already held it is one, and is dropped.
	for _, c := range []string{"conflicts", "decode_errors", "evictions", "budget_evictions", "stale_transitions", "dropped", "block_size_mismatches", "invalid_events"} {
		if v := counter(w, c); over(c, v, 0) {
			bad("%s %d, want 0 (last_error %q, last_reset %q)", c, v, w.GetLastError(), w.GetLastReset())
		}
	}
	// Resets beyond the restarts are the losses reported above.
	if over("restarts", w.GetRestarts(), uint64(restarts)) || w.GetRestarts() < uint64(restarts) ||
		over("resets", w.GetResets(), w.GetRestarts()+r.reportedOf(ref, "unrecovered_gaps")) {
		bad("restarts %d resets %d, want %d each: the engine restarted %d times during this daemon process (last_reset %q)", w.GetRestarts(), w.GetResets(), restarts, restarts, w.GetLastReset())
	}
}

// blockFlow is the blocks a worker's engine had sent and its index had
// applied at a checkpoint.
type blockFlow struct {
	sentStored, sentRemoved       int64
	appliedStored, appliedRemoved uint64
}

// checkFlow compares, between two checkpoints of one daemon process, the
// blocks the engine sent with those the index applied, so that a
// divergence says whether stores or removals went astray.
func (r *runner) checkFlow(name string, w *kvindexv1.WorkerStatus, e *Engine) {
	ref := e.Spec().Worker
	st := e.StatsLocked()
	now := blockFlow{st.Stored, st.Removed, w.GetBlocksStored(), w.GetBlocksRemoved()}
	r.mu.Lock()
	prev, ok := r.flow[ref]
	r.flow[ref] = now
	r.mu.Unlock()
	if !ok {
		return
	}
	ds, dr := now.sentStored-prev.sentStored, now.sentRemoved-prev.sentRemoved
	as, ar := int64(now.appliedStored-prev.appliedStored), int64(now.appliedRemoved-prev.appliedRemoved)
	if ds != as || dr != ar {
		r.fail.Add("block_flow", "checkpoint %s worker %s: since the last checkpoint the engine sent %d stored and %d removed blocks, the index applied %d and %d", name, ref, ds, dr, as, ar)
	}
}

// excess returns how far got is above want plus what was already
// reported for the worker's counter in this daemon process.
func (r *runner) excess(ref events.WorkerRef, counter string, got, want uint64) uint64 {
	return got - min(got, want+r.reportedOf(ref, counter))
}

func (r *runner) reportedOf(ref events.WorkerRef, counter string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reported[workerCounter{ref, counter}]
}

// checkAnswers scores prompts built from every engine's true cache. The
// caller holds every engine's lock.
func (r *runner) checkAnswers(ctx context.Context, name string) {
	rng := rand.New(rand.NewPCG(r.opts.Seed, stringSeed("checkpoint "+name)))
	for _, e := range r.engines {
		var prompts []promptCase
		recent := e.RecentLocked()
		rng.Shuffle(len(recent), func(i, j int) { recent[i], recent[j] = recent[j], recent[i] })
		for _, p := range recent[:min(6, len(recent))] {
			prompts = append(prompts, promptCase{"recent", p})
		}
		for range 6 {
			if p := e.CacheLocked().Chain(rng); p != nil {
				prompts = append(prompts, promptCase{"cached chain", p})
			}
		}
		n := len(prompts)
		for i := 0; i < n && i < 6; i++ {
			how, q := vary(rng, prompts[rng.IntN(n)].tokens, i%3, 300)
			prompts = append(prompts, promptCase{how, q})
		}
		for i, pc := range prompts {
			if ctx.Err() != nil {
				return
			}
			r.compare(ctx, name, e, pc, i)
		}
	}
}

// promptCase is a checkpoint prompt and how it was made.
type promptCase struct {
	source string
	tokens []uint32
}

// compare scores one prompt (by token ids; every fourth also by block
// keys and with every worker as a candidate) and checks each worker's
// index match (matched minus speculative blocks) exactly.
func (r *runner) compare(ctx context.Context, name string, from *Engine, pc promptCase, i int) {
	model := from.Spec().Model
	r.scoreAndCheck(ctx, name, from, pc, "token ids", &kvindexv1.ScoreRequest{Model: model, TokenIds: pc.tokens})
	if i%4 != 0 {
		return
	}
	m, err := indexer.NewModel(model, BlockSizeOf(model))
	if err != nil {
		r.fail.Add("rpc_error", "checkpoint %s: %v", name, err)
		return
	}
	if keys := m.PromptKeys(pc.tokens, nil, nil); len(keys) > 0 {
		req := &kvindexv1.ScoreRequest{Model: model, BlockKeys: make([]uint64, len(keys))}
		for i, k := range keys {
			req.BlockKeys[i] = uint64(k)
		}
		r.scoreAndCheck(ctx, name, from, pc, "block keys", req)
	}
	req := &kvindexv1.ScoreRequest{Model: model, TokenIds: pc.tokens}
	for _, w := range r.models[model] {
		req.Workers = append(req.Workers, &kvindexv1.WorkerRef{Pod: w.Pod, DpRank: uint32(w.DPRank)})
	}
	r.scoreAndCheck(ctx, name, from, pc, "candidates", req)
}

// scoreAndCheck scores req, a prompt from engine from (sent again while
// it is refused for overload), and checks the answer's sanity and, for
// every worker of the prompt's model, its match with the longest prefix
// its engine holds.
func (r *runner) scoreAndCheck(ctx context.Context, name string, from *Engine, pc promptCase, how string, req *kvindexv1.ScoreRequest) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var resp *kvindexv1.ScoreResponse
	if err := r.retryOverloaded(cctx, func() (err error) {
		resp, err = r.client.Score(cctx, req)
		return err
	}); err != nil {
		r.failLive(ctx, "rpc_error", "checkpoint %s: %v", name, err)
		return
	}
	r.checks.add("scores_checked")
	r.checkScore("checkpoint "+name+" "+how, req, resp)
	got := map[events.WorkerRef]*kvindexv1.WorkerScore{}
	for _, w := range resp.GetWorkers() {
		got[refOf(w)] = w
		if w.GetHealth() != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
			r.fail.Add("worker_state", "checkpoint %s: Score names %s with health %v", name, refOf(w), w.GetHealth())
		}
	}
	for _, ref := range r.models[req.GetModel()] {
		want := r.byRef[ref].CacheLocked().LongestPrefix(pc.tokens)
		var matched, spec uint32
		if w := got[ref]; w != nil {
			matched, spec = w.GetMatchedBlocks(), w.GetSpeculativeBlocks()
		}
		r.checks.add("comparisons")
		if int(matched-spec) == want {
			continue
		}
		file := r.saveWrong(r.checks.add("wrong_answers"), name, from, pc, ref, matched, spec, want)
		r.fail.Add("wrong_answer", "checkpoint %s, %s prompt of %d tokens from %s's cache, scored by %s: worker %s matched %d blocks (%d speculative), its engine holds %d; prompt in %s",
			name, pc.source, len(pc.tokens), from.Spec().Worker, how, ref, matched, spec, want, file)
	}
}

// saveWrong writes wrong answer n's prompt and figures to the work
// directory and returns the file's path.
func (r *runner) saveWrong(n int64, name string, from *Engine, pc promptCase, ref events.WorkerRef, matched, spec uint32, want int) string {
	if n > MaxKept {
		return "(not saved: only the first few are)"
	}
	path := filepath.Join(r.opts.Dir, fmt.Sprintf("wrong-%d.json", n))
	b, err := json.Marshal(map[string]any{
		"checkpoint": name, "model": from.Spec().Model, "source": pc.source, "from_engine": from.Spec().Worker.String(),
		"worker": ref.String(), "matched_blocks": matched, "speculative_blocks": spec, "engine_holds": want, "token_ids": pc.tokens,
	})
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		return "(not saved: " + err.Error() + ")"
	}
	return path
}

func (r *runner) runCheckpoints(ctx context.Context) {
	every(ctx, checkpointEvery, func(i int) {
		r.chaos.Lock()
		defer r.chaos.Unlock()
		if ctx.Err() == nil && !r.aborted.Load() {
			r.checkpoint(ctx, fmt.Sprint(i+1))
		}
	})
}
