package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/quote"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/scoring"
)

// Bounds of the operator's RPCs (Lookup, Dump, Diagnose, Watch).
const (
	// MaxLookupHolders bounds a LookupResponse's holder entries (over its
	// runs); past it the answer is truncated.
	MaxLookupHolders    = 65536
	DefaultDumpPageSize = 1000
	MaxDumpPageSize     = 10000
	// DefaultWatchBuffer and MaxWatchBuffer bound a Watch stream's queue.
	DefaultWatchBuffer = 256
	MaxWatchBuffer     = 4096
	MaxWatchWorkers    = 256 // WatchRequest.workers
	DefaultMaxWatches  = 64  // Options.MaxWatches
	maxWatchHashes     = 16  // WatchResponse.block_hashes
)

// promptOf validates and converts the prompt fields Lookup and Diagnose
// share with Score, as Score does.
func (s *Server) promptOf(ctx context.Context, req *kvindexv1.ScoreRequest) (*scoring.Request, error) {
	sc := new(scoreScratch)
	if err := s.convert(ctx, req, false, sc); err != nil {
		return nil, err
	}
	return &sc.req, nil
}

// workerOf resolves a request's worker field.
func (s *Server) workerOf(field string, r *kvindexv1.WorkerRef) (*indexer.Worker, error) {
	switch {
	case r == nil:
		return nil, status.Errorf(codes.InvalidArgument, "%s: required", field)
	case r.GetPod() == "":
		return nil, status.Errorf(codes.InvalidArgument, "%s.pod: required", field)
	case r.GetDpRank() > math.MaxInt32:
		return nil, status.Errorf(codes.InvalidArgument, "%s.dp_rank: %d is out of range", field, r.GetDpRank())
	}
	ref := events.WorkerRef{Pod: r.GetPod(), DPRank: int(r.GetDpRank())}
	if w := s.ix.LookupWorker(ref); w != nil {
		return w, nil
	}
	ws := s.ix.Workers()
	names := make([]string, 0, min(len(ws), 8))
	for _, w := range ws {
		if len(names) == cap(names) {
			names = append(names, "...")
			break
		}
		names = append(names, w.Info().Ref.String())
	}
	known := strings.Join(names, ", ")
	defaults.Zero(&known, "none")
	return nil, status.Errorf(codes.InvalidArgument, "%s: unknown worker %s; known: %s", field, quote.Q(ref.String()), quote.S(known))
}

// workerHealth returns a worker's stream health and its reason.
func (s *Server) workerHealth(ref events.WorkerRef) (events.Health, string) {
	hs, ok := s.stats.(events.HealthSource)
	if !ok {
		return events.HealthUnknown, ""
	}
	h := hs.Health(ref).Load()
	if h == events.HealthOK || h == events.HealthUnknown {
		return h, ""
	}
	for _, st := range s.stats.WorkerStats() {
		if st.Worker == ref {
			return h, st.HealthReason
		}
	}
	return h, ""
}

// mediaNames lists the media of mask in medium order.
func mediaNames(mask uint8) []string {
	var out []string
	for m := range events.NumMedia {
		if mask&(1<<m) != 0 {
			out = append(out, events.Medium(m).String())
		}
	}
	return out
}

// Lookup implements kvindexv1.IndexServiceServer: each run of the prompt's
// blocks with its holders. Cost: O(blocks + holders), allocating per run and
// holder.
func (s *Server) Lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	p, err := s.promptOf(ctx, &kvindexv1.ScoreRequest{Model: req.GetModel(), TokenIds: req.GetTokenIds(), BlockKeys: req.GetBlockKeys(),
		LoraName: req.GetLoraName(), CacheSalt: req.GetCacheSalt(), BlockExtraKeys: req.GetBlockExtraKeys(), Prompt: req.GetPrompt(), Messages: req.GetMessages()})
	if err != nil {
		return nil, err
	}
	keys := p.Keys
	if keys == nil {
		keys = p.Model.PromptKeys(p.Tokens, p.Extras, nil)
	}
	resp := &kvindexv1.LookupResponse{
		BlockSize:    clampU32(p.Model.BlockSize()),
		PromptBlocks: clampU32(len(keys)),
		Keys:         make([]uint64, len(keys)),
	}
	for i, k := range keys {
		resp.Keys[i] = uint64(k)
	}
	entries := 0
	health := map[indexer.WorkerID]kvindexv1.WorkerHealth{}
	n := s.ix.Lookup(keys, func(from, to int, held []indexer.Holder) bool {
		if entries+len(held) > MaxLookupHolders {
			resp.Truncated = true
			return false
		}
		entries += len(held)
		run := &kvindexv1.BlockRun{FirstBlock: clampU32(from), EndBlock: clampU32(to)}
		for _, h := range held {
			w := s.ix.Worker(h.Worker)
			if w == nil {
				continue // removed meanwhile
			}
			ref := w.Info().Ref
			hv, ok := health[h.Worker]
			if !ok {
				hh, _ := s.workerHealth(ref)
				hv = toHealth(hh)
				health[h.Worker] = hv
			}
			run.Holders = append(run.Holders, &kvindexv1.BlockHolder{Worker: toRef(ref), Media: mediaNames(h.Media), Health: hv})
		}
		resp.Runs = append(resp.Runs, run)
		return true
	})
	resp.IndexedBlocks = clampU32(n)
	// Trailing runs held by nobody say nothing.
	for len(resp.Runs) > 0 && len(resp.Runs[len(resp.Runs)-1].Holders) == 0 {
		resp.Runs = resp.Runs[:len(resp.Runs)-1]
	}
	return resp, nil
}

// parsePageToken decodes a NextPageToken: "k" and the page's last key in hex.
func parsePageToken(t string) (indexer.Key, error) {
	hex, ok := strings.CutPrefix(t, "k")
	v, err := strconv.ParseUint(hex, 16, 64)
	if !ok || err != nil {
		return 0, errors.New("not a token Dump returned")
	}
	return indexer.Key(v), nil
}

// Dump implements kvindexv1.IndexServiceServer: a page of the worker's
// resident keys in key order, with its digest. Cost: O(the worker's blocks).
func (s *Server) Dump(ctx context.Context, req *kvindexv1.DumpRequest) (*kvindexv1.DumpResponse, error) {
	w, err := s.workerOf("worker", req.GetWorker())
	if err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = DefaultDumpPageSize
	case size > MaxDumpPageSize:
		return nil, status.Errorf(codes.InvalidArgument, "page_size: %d exceeds the limit of %d", size, MaxDumpPageSize)
	}
	var after indexer.Key
	hasAfter := req.GetPageToken() != ""
	if hasAfter {
		if after, err = parsePageToken(req.GetPageToken()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "page_token: %s: %v", quote.Q(req.GetPageToken()), err)
		}
	}
	// One more than the page, to know whether another follows.
	page, total, digest := w.Resident(after, hasAfter, size+1)
	info := w.Info()
	resp := &kvindexv1.DumpResponse{
		Worker:       toRef(info.Ref),
		Model:        info.Model,
		Digest:       digest,
		ResidentKeys: uint64(total),
		Keyed:        info.Keyed,
	}
	if len(page) > size {
		page = page[:size]
		resp.NextPageToken = "k" + strconv.FormatUint(uint64(page[len(page)-1].Key), 16)
	}
	resp.Blocks = make([]*kvindexv1.ResidentBlock, len(page))
	for i, r := range page {
		resp.Blocks[i] = &kvindexv1.ResidentBlock{Key: uint64(r.Key), Media: mediaNames(r.Media)}
	}
	return resp, nil
}

// MaxEngineHashes bounds DiagnoseRequest.engine_block_hashes.
const MaxEngineHashes = DefaultMaxBlockKeys

// Diagnose implements kvindexv1.IndexServiceServer: why the worker misses
// the prompt.
func (s *Server) Diagnose(ctx context.Context, req *kvindexv1.DiagnoseRequest) (*kvindexv1.DiagnoseResponse, error) {
	p, err := s.promptOf(ctx, &kvindexv1.ScoreRequest{Model: req.GetModel(), TokenIds: req.GetTokenIds(), BlockKeys: req.GetBlockKeys(),
		LoraName: req.GetLoraName(), CacheSalt: req.GetCacheSalt(), BlockExtraKeys: req.GetBlockExtraKeys(), Prompt: req.GetPrompt(), Messages: req.GetMessages()})
	if err != nil {
		return nil, err
	}
	w, err := s.workerOf("worker", req.GetWorker())
	if err != nil {
		return nil, err
	}
	if n := len(req.GetEngineBlockHashes()); n > 0 {
		switch {
		case len(p.Tokens) == 0:
			return nil, status.Error(codes.InvalidArgument, "engine_block_hashes: needs token_ids, prompt or messages (the parity check keys the prompt's tokens)")
		case n > MaxEngineHashes:
			return nil, status.Errorf(codes.InvalidArgument, "engine_block_hashes: %d hashes exceed the limit of %d", n, MaxEngineHashes)
		}
	}
	ref := w.Info().Ref
	h, why := s.workerHealth(ref)
	d := s.ix.Diagnose(&indexer.DiagnoseQuery{
		Model: p.Model, Worker: w, Tokens: p.Tokens, Extras: p.Extras, Keys: p.Keys,
		EngineHashes: req.GetEngineBlockHashes(), Health: h, HealthReason: why,
	})
	resp := &kvindexv1.DiagnoseResponse{
		Worker:          toRef(ref),
		Model:           w.Info().Model,
		BlockSize:       clampU32(p.Model.BlockSize()),
		PromptBlocks:    clampU32(d.Blocks),
		MatchedBlocks:   clampU32(d.Matched),
		FirstMissKey:    uint64(d.FirstMiss),
		Health:          toHealth(h),
		HealthReason:    why,
		HistoryRemovals: clampU32(d.History),
	}
	for _, f := range d.Findings {
		pf := &kvindexv1.DiagnoseFinding{Reason: kvindexv1.DiagnoseReason(f.Reason), Detail: f.Detail}
		if !f.At.IsZero() {
			pf.EventTime = timestamppb.New(f.At)
		}
		resp.Findings = append(resp.Findings, pf)
	}
	if pr := d.Parity; pr != nil {
		resp.Parity = &kvindexv1.ParityCheck{
			Verdict:      kvindexv1.ParityVerdict(pr.Verdict),
			Detail:       pr.Detail,
			EngineBlocks: clampU32(pr.Engine),
			KnownBlocks:  clampU32(pr.Known),
			AgreedBlocks: clampU32(pr.Agreed),
		}
		if pr.First >= 0 {
			resp.Parity.FirstDisagreement = clampU32(pr.First)
		}
	}
	return resp, nil
}

// watchFilter is a validated WatchRequest.
type watchFilter struct {
	model   string
	workers map[events.WorkerRef]bool // nil: all
	kinds   uint32                    // bit per WatchEventKind; 0: all
	hashes  bool
}

func (f *watchFilter) wants(k kvindexv1.WatchEventKind) bool {
	return f.kinds == 0 || f.kinds&(1<<k) != 0
}

// Watch implements kvindexv1.IndexServiceServer: the applied events,
// filtered, through a bounded queue that drops and counts what a slow reader
// cannot take; the index's appliers never wait on a stream.
func (s *Server) Watch(req *kvindexv1.WatchRequest, stream grpc.ServerStreamingServer[kvindexv1.WatchResponse]) error {
	f, buf, err := s.watchFilterOf(req)
	if err != nil {
		return err
	}
	if n := s.watches.Add(1); n > int64(s.opts.MaxWatches) {
		s.watches.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "watch: the server's limit of %d concurrent watches is reached", s.opts.MaxWatches)
	}
	defer s.watches.Add(-1)

	ch := make(chan *kvindexv1.WatchResponse, buf)
	var dropped atomic.Uint64
	offer := func(ev *kvindexv1.WatchResponse) {
		select {
		case ch <- ev:
		default:
			dropped.Add(1)
			s.metrics.watchDropped()
		}
	}
	remove := s.ix.AddObserver(func(w *indexer.Worker, a *indexer.Applied) { f.convert(w, a, offer) })
	defer remove()
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case ev := <-ch:
			ev.Dropped = dropped.Load()
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

// watchFilterOf validates req into a filter and the queue's length.
func (s *Server) watchFilterOf(req *kvindexv1.WatchRequest) (*watchFilter, int, error) {
	f := &watchFilter{model: req.GetModel(), hashes: req.GetHashes()}
	if f.model != "" {
		if _, ok := s.ix.Model(f.model); !ok {
			return nil, 0, s.unknownModel(f.model)
		}
	}
	if n := len(req.GetWorkers()); n > MaxWatchWorkers {
		return nil, 0, status.Errorf(codes.InvalidArgument, "workers: %d workers exceed the limit of %d", n, MaxWatchWorkers)
	}
	for i, r := range req.GetWorkers() {
		w, err := s.workerOf(fmt.Sprintf("workers[%d]", i), r)
		if err != nil {
			return nil, 0, err
		}
		if f.workers == nil {
			f.workers = map[events.WorkerRef]bool{}
		}
		f.workers[w.Info().Ref] = true
	}
	for i, k := range req.GetKinds() {
		if k <= kvindexv1.WatchEventKind_WATCH_EVENT_KIND_UNSPECIFIED || k > kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED {
			return nil, 0, status.Errorf(codes.InvalidArgument, "kinds[%d]: %d is not a kind of event", i, k)
		}
		f.kinds |= 1 << k
	}
	buf := int(req.GetBuffer())
	switch {
	case buf == 0:
		buf = DefaultWatchBuffer
	case buf > MaxWatchBuffer:
		return nil, 0, status.Errorf(codes.InvalidArgument, "buffer: %d exceeds the limit of %d", buf, MaxWatchBuffer)
	}
	return f, buf, nil
}

// convert offers the watch events f wants of what was applied to w, on the
// applier's goroutine: offer must not block.
func (f *watchFilter) convert(w *indexer.Worker, a *indexer.Applied, offer func(*kvindexv1.WatchResponse)) {
	info := w.Info()
	if f.model != "" && info.Model != f.model || f.workers != nil && !f.workers[info.Ref] {
		return
	}
	now := timestamppb.Now()
	base := func(k kvindexv1.WatchEventKind) *kvindexv1.WatchResponse {
		return &kvindexv1.WatchResponse{Worker: toRef(info.Ref), Model: info.Model, Time: now, Kind: k}
	}
	switch {
	case a.Batch != nil:
		for i := range a.Batch.Events {
			ev := &a.Batch.Events[i]
			k := watchKind(ev.Kind)
			if k == kvindexv1.WatchEventKind_WATCH_EVENT_KIND_UNSPECIFIED || !f.wants(k) {
				continue
			}
			out := base(k)
			out.Blocks = clampU32(len(ev.BlockHashes))
			out.LoraName = ev.LoRAName
			if k != kvindexv1.WatchEventKind_WATCH_EVENT_KIND_CLEARED {
				out.Medium = ev.Medium.String()
			}
			if k == kvindexv1.WatchEventKind_WATCH_EVENT_KIND_STORED && len(ev.TokenIDs) > 0 {
				out.BlockSize = clampU32(ev.BlockSize)
			}
			if f.hashes && len(ev.BlockHashes) > 0 {
				out.BlockHashes = slices.Clone(ev.BlockHashes[:min(len(ev.BlockHashes), maxWatchHashes)])
			}
			offer(out)
		}
	case a.Delta != nil:
		if f.wants(kvindexv1.WatchEventKind_WATCH_EVENT_KIND_DELTA) {
			out := base(kvindexv1.WatchEventKind_WATCH_EVENT_KIND_DELTA)
			n := 0
			for i := range a.Delta.Entries {
				if e := &a.Delta.Entries[i]; e.BlockEdge || e.Op == indexer.OpDrop {
					n++
				}
			}
			out.Blocks = clampU32(n)
			offer(out)
		}
	case a.Restore != nil:
		if f.wants(kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED) {
			out := base(kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESTORED)
			out.Blocks = clampU32(int(a.Restore.Blocks))
			out.Reason = a.Restore.From
			offer(out)
		}
	default:
		if f.wants(kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESET) {
			out := base(kvindexv1.WatchEventKind_WATCH_EVENT_KIND_RESET)
			out.Reason = a.Reset
			offer(out)
		}
	}
}

// watchKind maps an event kind to its WatchEventKind.
func watchKind(k events.Kind) kvindexv1.WatchEventKind {
	switch k {
	case events.KindBlockStored:
		return kvindexv1.WatchEventKind_WATCH_EVENT_KIND_STORED
	case events.KindBlockRemoved:
		return kvindexv1.WatchEventKind_WATCH_EVENT_KIND_REMOVED
	case events.KindAllBlocksCleared:
		return kvindexv1.WatchEventKind_WATCH_EVENT_KIND_CLEARED
	}
	return kvindexv1.WatchEventKind_WATCH_EVENT_KIND_UNSPECIFIED
}
