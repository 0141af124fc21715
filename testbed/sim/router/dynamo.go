package router

import (
	"context"
	"math"
	"slices"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// dynamo is Dynamo's KV router with its defaults (github.com/ai-dynamo/
// dynamo, lib/kv-router/src/scheduling/selector.rs at commit 01690d42e3b9,
// DefaultWorkerSelector; defaults in lib/kv-router/src/scheduling/
// config.rs at commit 0243c51bb6e8 and the later defaults of
// overlap_score_credit_decay and decode_active_request_weight, both 0;
// the same cost in lib/kv-router/src/scheduling/selector/default.rs at
// commit 07a6c9ce3bb0):
// for each worker w, in blocks of the engine's block size bs,
//
//	cost_w = max(0, (active_prefill_tokens_w + ISL) / bs - overlap_w)
//	         + potential_decode_blocks_w
//
// overlap_score_credit and prefill_load_scale 1. overlap_w is w's cached
// prefix from KV events (here kvindex's exact index). The rest is the
// router's own bookkeeping (lib/kv-router/src/sequences):
// active_prefill_tokens_w is the uncached prompt tokens (ISL - overlap) of
// the requests it routed to w that have not produced their first token
// (router_prefill_load_model none: no decay); potential_decode_blocks_w
// is the distinct full prompt blocks, by chained hash, of the requests it
// routed to w that have not finished, plus this prompt's blocks not among
// them (router_assume_kv_reuse true, router_track_output_blocks false).
// router_temperature 0: the least cost, ties uniformly at random
// (reservoir sampling). Not modelled: the router queue that holds requests
// while every worker's active prefill exceeds router_queue_threshold (16)
// times max_num_batched_tokens, which only overload reaches.
type dynamo struct {
	base
	ties
	pk preciseKV
	bs int

	// prefill[i] is active_prefill_tokens of engine i; active[i] counts the
	// unfinished requests holding each prompt block hash there.
	prefill []int64
	active  []map[uint64]int32
	reqs    map[int]*dynamoReq
	hashes  []uint64
}

// dynamoReq is one routed request's share of the bookkeeping.
type dynamoReq struct {
	engine  int
	prefill int64
	blocks  []uint64
}

func newDynamo(cfg Config) *dynamo {
	n := cfg.Fleet.Engines()
	r := &dynamo{ties: newTies(cfg.Seed, 0xd1a), pk: newPreciseKV(Dynamo, cfg), bs: cfg.BlockSize,
		prefill: make([]int64, n), active: make([]map[uint64]int32, n), reqs: make(map[int]*dynamoReq)}
	for i := range r.active {
		r.active[i] = make(map[uint64]int32)
	}
	return r
}

func (r *dynamo) Name() string { return Dynamo }

func (r *dynamo) Route(ctx context.Context, req *Request) (int, error) {
	cached, err := r.pk.score(ctx, req)
	if err != nil {
		return 0, err
	}
	r.hashes = chain(r.hashes[:0], 0x64796e616d6f, req.Content[:req.PromptBlocks]) // "dynamo"
	bs := float64(r.bs)
	best := math.Inf(1)
	r.reset()
	for i := range r.prefill {
		fresh := 0
		for _, h := range r.hashes {
			if r.active[i][h] == 0 {
				fresh++
			}
		}
		c := max(0, float64(r.prefill[i]+int64(req.PromptLen))/bs-float64(cached[i]/r.bs)) + float64(len(r.active[i])+fresh)
		switch {
		case c < best:
			best = c
			r.first(i)
		case c == best:
			r.add(i)
		}
	}
	pick := r.pick()
	d := &dynamoReq{engine: pick, prefill: int64(max(0, req.PromptLen-cached[pick])), blocks: slices.Clone(r.hashes)}
	r.prefill[pick] += d.prefill
	for _, h := range d.blocks {
		r.active[pick][h]++
	}
	r.reqs[req.ID] = d
	return pick, nil
}

// PrefillDone ends the request's active prefill.
func (r *dynamo) PrefillDone(_ context.Context, req *workload.Request, _ int) error {
	if d, ok := r.reqs[req.ID]; ok {
		r.prefill[d.engine] -= d.prefill
		d.prefill = 0
	}
	return nil
}

// Finished implements Finisher: the request's blocks leave its engine's
// active set.
func (r *dynamo) Finished(req *workload.Request, _ int) {
	d, ok := r.reqs[req.ID]
	if !ok {
		return
	}
	r.prefill[d.engine] -= d.prefill
	m := r.active[d.engine]
	for _, h := range d.blocks {
		if m[h]--; m[h] <= 0 {
			delete(m, h)
		}
	}
	delete(r.reqs, req.ID)
}
