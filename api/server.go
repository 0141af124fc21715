package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/quote"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/scoring"
)

// Default limits of Options.
const (
	// DefaultMaxTokens bounds ScoreRequest.token_ids (1 Mi tokens).
	DefaultMaxTokens = 1 << 20
	// DefaultMaxBlockKeys bounds ScoreRequest.block_keys.
	DefaultMaxBlockKeys = 65536
	// DefaultMaxCandidates bounds ScoreRequest.workers.
	DefaultMaxCandidates = 4096
)

// Options configures a Server. The zero value is usable; 0 limits mean the
// Default* constants.
type Options struct {
	// MaxTokens, MaxBlockKeys and MaxCandidates bound a Score's token_ids,
	// block_keys and workers.
	MaxTokens, MaxBlockKeys, MaxCandidates int
	// IncludeStale keeps stale workers in Score answers, flagged STALE; by
	// default they are left out unless named as candidates.
	IncludeStale bool
	// NoGroupCaps matches hybrid models' workers by their prefix group
	// alone (scoring.Options.NoGroupCaps; config scoring.group_caps false).
	NoGroupCaps bool
	// Policy is the ranking policy requests start from; nil means
	// scoring.DefaultPolicy().
	Policy *scoring.Policy
	// Tracker records Route decisions; nil means one with default TTLs that
	// only Release and Record sweep.
	Tracker *scoring.Tracker
	// Tokenizer tokenizes prompt and messages; nil refuses them
	// (FAILED_PRECONDITION).
	Tokenizer Tokenizer
	// Loads holds scraped engine load; nil means none.
	Loads *scoring.LoadBoard
	// Admission bounds the work taken on; the zero value is on with defaults.
	Admission AdmissionOptions
	// KeepaliveMinTime is the shortest client keepalive interval tolerated
	// (more often closes the connection); 0 means 10 s.
	KeepaliveMinTime time.Duration
	// MaxConcurrentStreams bounds each connection's calls; 0 means 256.
	MaxConcurrentStreams uint32
	// MaxWatches bounds concurrent Watch streams (past it ResourceExhausted).
	MaxWatches int
	// MaxTenants bounds the tenant labels of the hit-ratio metrics; later
	// tenants share "_other".
	MaxTenants int
	// Registerer, when not nil, receives the server's metrics.
	Registerer prometheus.Registerer
}

// Server implements kvindexv1.IndexServiceServer over an index and,
// optionally, the transport's stream statistics: it validates requests,
// ranks with a scoring.Scorer (the entry an in-process router calls) and
// converts the ranking. A Score allocates only its response (a fixed number
// of slabs); working memory is pooled.
type Server struct {
	kvindexv1.UnimplementedIndexServiceServer

	ix        *indexer.Index
	stats     events.StatsSource // may be nil
	opts      Options
	metrics   *metrics    // nil without Options.Registerer
	hits      *hitMetrics // nil without Options.Registerer
	health    *health.Server
	scorer    *scoring.Scorer
	scratch   sync.Pool // *scoreScratch
	codec     *Codec
	admission *admission   // nil when Options.Admission.Off
	watches   atomic.Int64 // open Watch streams
}

// NewServer returns a Server over ix; with stats nil, ListWorkers reports
// only the index's counters. Metrics already registered are shared; other
// registration errors panic.
func NewServer(ix *indexer.Index, stats events.StatsSource, opts Options) *Server {
	defaults.Positive(&opts.MaxTokens, DefaultMaxTokens)
	defaults.Positive(&opts.MaxBlockKeys, DefaultMaxBlockKeys)
	defaults.Positive(&opts.MaxCandidates, DefaultMaxCandidates)
	defaults.Positive(&opts.MaxWatches, DefaultMaxWatches)
	defaults.Positive(&opts.MaxConcurrentStreams, 256)
	defaults.Positive(&opts.KeepaliveMinTime, 10*time.Second)
	hs, _ := stats.(events.HealthSource)
	s := &Server{
		ix:      ix,
		stats:   stats,
		opts:    opts,
		health:  health.NewServer(),
		codec:   newServerCodec(),
		scratch: sync.Pool{New: func() any { return new(scoreScratch) }},
		scorer: scoring.New(ix, scoring.Options{
			Policy:       opts.Policy,
			Tracker:      opts.Tracker,
			Loads:        opts.Loads,
			Health:       hs,
			IncludeStale: opts.IncludeStale,
			NoGroupCaps:  opts.NoGroupCaps,
		}),
	}
	if opts.Registerer != nil {
		s.metrics = newMetrics(opts.Registerer)
		s.hits = newHitMetrics(opts.Registerer, opts.MaxTenants)
		// Unchecked, so every server registers its own pruner.
		opts.Registerer.MustRegister(hitPruner{h: s.hits, ix: ix})
	}
	if !opts.Admission.Off {
		s.admission = newAdmission(opts.Admission, nil)
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(kvindexv1.IndexService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Scorer returns the server's ranking entry, for in-process routers.
func (s *Server) Scorer() *scoring.Scorer { return s.scorer }

// Register registers the IndexService, health (SERVING) and reflection on g
// before g.Serve.
func (s *Server) Register(g *grpc.Server) {
	kvindexv1.RegisterIndexServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
}

// Health returns the health service Register installs; its Shutdown reports
// NOT_SERVING while the daemon drains.
func (s *Server) Health() *health.Server { return s.health }

// scoreScratch is one call's pooled working memory; nothing outlives a call.
type scoreScratch struct {
	res    scoring.Result
	req    scoring.Request
	cands  []events.WorkerRef
	loads  []scoring.RequestLoad
	extras indexer.PromptExtras
	keys   []indexer.Key
	pol    scoring.Policy
}

// putScratch pools sc, dropping references into the request and keys grown
// for a huge prompt.
func (s *Server) putScratch(sc *scoreScratch) {
	clear(sc.cands)
	clear(sc.loads)
	sc.req = scoring.Request{}
	sc.extras = indexer.PromptExtras{}
	if cap(sc.keys) > 1<<16 {
		sc.keys = nil
	}
	s.scratch.Put(sc)
}

// Score implements kvindexv1.IndexServiceServer: each worker's longest
// resident prefix of the prompt, ranked by the policy. Cost: scoring's, plus
// the response's fixed slabs (and reasons with explain).
func (s *Server) Score(ctx context.Context, req *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	start := time.Now()
	sc, err := s.rank(ctx, req, req.GetPolicy() != nil)
	if err != nil {
		s.metrics.observe(start, err)
		return nil, err
	}
	resp := s.buildScoreResponse(sc, req)
	var first *scoring.Candidate
	if len(sc.res.Ranked) > 0 {
		first = &sc.res.Ranked[0]
	}
	s.hits.observe(sc.res.Model, first, sc.res.Prompt.Tokens, req.GetTenant())
	s.putScratch(sc)
	s.metrics.observe(start, nil)
	return resp, nil
}

// convert validates req into sc.req, tokenizing a text prompt; with all,
// every allowed worker of the model is ranked, matched or not.
func (s *Server) convert(ctx context.Context, req *kvindexv1.ScoreRequest, all bool, sc *scoreScratch) error {
	model, err := s.checkScoreRequest(req)
	if err != nil {
		return err
	}
	toks := req.GetTokenIds()
	if req.GetPrompt() != "" || len(req.GetMessages()) > 0 {
		if toks, err = s.tokenize(ctx, req); err != nil {
			return err
		}
		if err := s.checkTokens(req, model, len(toks)); err != nil {
			return err
		}
	}
	sr := &sc.req
	*sr = scoring.Request{Model: model, All: all}
	if p := req.GetPolicy(); p != nil {
		sc.pol, err = scoring.Override{
			Name: p.GetName(), GPUWeight: p.GetGpuWeight(), CPUWeight: p.GetCpuWeight(), StorageWeight: p.GetStorageWeight(),
			TierWeights: p.GetTierWeights(), LoadWeight: p.GetLoadWeight(), Guard: p.GetGuard(), StaticK: p.GetStaticK(),
		}.Apply(s.scorer.Policy())
		if err != nil {
			return status.Error(codes.InvalidArgument, "policy."+err.Error())
		}
		sr.Policy = &sc.pol
	}
	sc.cands = sc.cands[:0]
	for i, r := range req.GetWorkers() {
		if r.GetPod() == "" {
			return status.Errorf(codes.InvalidArgument, "workers[%d].pod: required", i)
		}
		if r.GetDpRank() > math.MaxInt32 {
			return status.Errorf(codes.InvalidArgument, "workers[%d].dp_rank: %d is out of range", i, r.GetDpRank())
		}
		sc.cands = append(sc.cands, events.WorkerRef{Pod: r.GetPod(), DPRank: int(r.GetDpRank())})
	}
	sr.Candidates = sc.cands
	sc.loads = sc.loads[:0]
	for _, wl := range req.GetLoads() {
		r := wl.GetWorker()
		sc.loads = append(sc.loads, scoring.RequestLoad{
			Worker:              events.WorkerRef{Pod: r.GetPod(), DPRank: int(r.GetDpRank())},
			Running:             wl.GetRunning(),
			Waiting:             wl.GetWaiting(),
			KVUsage:             wl.GetKvCacheUsage(),
			QueuedPrefillTokens: wl.GetQueuedPrefillTokens(),
		})
	}
	sr.Loads = sc.loads
	if len(toks) > 0 || len(req.GetBlockKeys()) == 0 {
		sr.Tokens = toks
		if req.GetLoraName() != "" || req.GetCacheSalt() != "" || len(req.GetBlockExtraKeys()) > 0 {
			sc.extras = indexer.PromptExtras{LoRAName: req.GetLoraName(), CacheSalt: req.GetCacheSalt()}
			if len(req.GetBlockExtraKeys()) > 0 {
				bx, err := blockExtras(req.GetBlockExtraKeys())
				if err != nil {
					return err
				}
				sc.extras.BlockExtras = bx
			}
			sr.Extras = &sc.extras
		}
	} else {
		sc.keys = slices.Grow(sc.keys[:0], len(req.GetBlockKeys()))
		for _, k := range req.GetBlockKeys() {
			sc.keys = append(sc.keys, indexer.Key(k))
		}
		sr.Keys = sc.keys
	}
	return nil
}

// rank converts and ranks req into scratch the caller must putScratch.
func (s *Server) rank(ctx context.Context, req *kvindexv1.ScoreRequest, all bool) (*scoreScratch, error) {
	sc := s.scratch.Get().(*scoreScratch)
	if err := s.convert(ctx, req, all, sc); err != nil {
		s.putScratch(sc)
		return nil, err
	}
	if err := s.scorer.Score(&sc.req, &sc.res); err != nil {
		s.putScratch(sc)
		return nil, scoringStatus(err)
	}
	return sc, nil
}

// scoringStatus maps a scorer's error to its gRPC status.
func scoringStatus(err error) error {
	var re *scoring.RequestError
	switch {
	case errors.As(err, &re):
		return status.Error(codes.InvalidArgument, re.Error())
	case errors.Is(err, scoring.ErrDuplicateRequest):
		return status.Errorf(codes.AlreadyExists, "request_id: %v", err)
	case errors.Is(err, scoring.ErrNoWorker):
		return status.Errorf(codes.FailedPrecondition, "score.model: %v", err)
	case errors.Is(err, scoring.ErrTooManyFlights):
		return status.Errorf(codes.ResourceExhausted, "request_id: %v", err)
	case errors.Is(err, scoring.ErrNotOwner):
		return status.Errorf(codes.PermissionDenied, "request_id: %v", err)
	}
	return status.Error(codes.Internal, err.Error())
}

// Route implements kvindexv1.IndexServiceServer: rank every worker, choose
// the best (or the pick), and record the choice as speculative blocks and
// in-flight load (scoring.Scorer.Route).
func (s *Server) Route(ctx context.Context, req *kvindexv1.RouteRequest) (*kvindexv1.RouteResponse, error) {
	if err := checkRequestID(req.GetRequestId()); err != nil {
		return nil, err
	}
	if req.GetScore() == nil {
		return nil, status.Error(codes.InvalidArgument, "score: required")
	}
	sc := s.scratch.Get().(*scoreScratch)
	defer s.putScratch(sc)
	if err := s.convert(ctx, req.GetScore(), true, sc); err != nil {
		return nil, err
	}
	var pick *events.WorkerRef
	if p := req.GetPick(); p != nil {
		pick = &events.WorkerRef{Pod: p.GetPod(), DPRank: int(p.GetDpRank())}
	}
	chosen, err := s.scorer.Route(req.GetRequestId(), principal(ctx), &sc.req, pick, &sc.res)
	if err != nil {
		return nil, scoringStatus(err)
	}
	resp := s.buildScoreResponse(sc, req.GetScore())
	s.hits.observe(sc.res.Model, &sc.res.Ranked[chosen], sc.res.Prompt.Tokens, req.GetScore().GetTenant())
	return &kvindexv1.RouteResponse{Chosen: resp.Workers[chosen].GetWorker(), Ranking: resp}, nil
}

// Release implements kvindexv1.IndexServiceServer.
func (s *Server) Release(ctx context.Context, req *kvindexv1.ReleaseRequest) (*kvindexv1.ReleaseResponse, error) {
	if err := checkRequestID(req.GetRequestId()); err != nil {
		return nil, err
	}
	released, err := s.scorer.Release(req.GetRequestId(), principal(ctx))
	if err != nil {
		return nil, scoringStatus(err)
	}
	return &kvindexv1.ReleaseResponse{Released: released}, nil
}

// MaxTenantBytes bounds ScoreRequest.tenant (a metric label).
const MaxTenantBytes = 128

// MaxRequestIDBytes bounds request_id, kept for every request in flight.
const MaxRequestIDBytes = 256

func checkRequestID(id string) error {
	switch {
	case id == "":
		return status.Error(codes.InvalidArgument, "request_id: required")
	case len(id) > MaxRequestIDBytes:
		return status.Errorf(codes.InvalidArgument, "request_id: %d bytes exceed the limit of %d", len(id), MaxRequestIDBytes)
	}
	return nil
}

// principal names ctx's client for request ownership ("" without auth).
func principal(ctx context.Context) string {
	id, _ := IdentityFrom(ctx)
	return id
}

// checkScoreRequest validates what needs no worker table; it returns the model.
func (s *Server) checkScoreRequest(req *kvindexv1.ScoreRequest) (*indexer.Model, error) {
	name := req.GetModel()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "model: required")
	}
	model, ok := s.ix.Model(name)
	if !ok {
		return nil, s.unknownModel(name)
	}
	nTok, nKeys := len(req.GetTokenIds()), len(req.GetBlockKeys())
	given := 0
	for _, n := range []int{nTok, nKeys, len(req.GetPrompt()), len(req.GetMessages())} {
		if n > 0 {
			given++
		}
	}
	switch {
	case given > 1:
		return nil, status.Error(codes.InvalidArgument, "token_ids, block_keys, prompt, messages: give exactly one")
	case given == 0:
		return nil, status.Error(codes.InvalidArgument, "token_ids: required (or block_keys, prompt or messages)")
	case nTok > s.opts.MaxTokens:
		return nil, status.Errorf(codes.InvalidArgument, "token_ids: %d tokens exceed the limit of %d", nTok, s.opts.MaxTokens)
	case nKeys > s.opts.MaxBlockKeys:
		return nil, status.Errorf(codes.InvalidArgument, "block_keys: %d keys exceed the limit of %d", nKeys, s.opts.MaxBlockKeys)
	}
	if n := len(req.GetTenant()); n > MaxTenantBytes {
		return nil, status.Errorf(codes.InvalidArgument, "tenant: %d bytes exceed the limit of %d", n, MaxTenantBytes)
	}
	if n := len(req.GetWorkers()); n > s.opts.MaxCandidates {
		return nil, status.Errorf(codes.InvalidArgument, "workers: %d candidates exceed the limit of %d", n, s.opts.MaxCandidates)
	}
	if nTok > 0 {
		if err := s.checkTokens(req, model, nTok); err != nil {
			return nil, err
		}
	}
	if n := len(req.GetBlockExtraKeys()); n > 0 && nKeys > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "block_extra_keys: %d entries for a prompt of 0 full blocks", n)
	}
	if nKeys > 0 {
		if req.GetLoraName() != "" {
			return nil, status.Error(codes.InvalidArgument, "lora_name: not allowed with block_keys (the keys already encode the adapter)")
		}
		if req.GetCacheSalt() != "" {
			return nil, status.Error(codes.InvalidArgument, "cache_salt: not allowed with block_keys (the keys already encode the salt)")
		}
	}
	return model, nil
}

// checkTokens validates the token count and block_extra_keys against it.
func (s *Server) checkTokens(req *kvindexv1.ScoreRequest, model *indexer.Model, nTok int) error {
	if nTok > s.opts.MaxTokens {
		field := "token_ids"
		if nTok != len(req.GetTokenIds()) {
			field = "prompt"
			if len(req.GetMessages()) > 0 {
				field = "messages"
			}
		}
		return status.Errorf(codes.InvalidArgument, "%s: %d tokens exceed the limit of %d", field, nTok, s.opts.MaxTokens)
	}
	if n := len(req.GetBlockExtraKeys()); n > 0 && n > nTok/model.BlockSize() {
		return status.Errorf(codes.InvalidArgument, "block_extra_keys: %d entries for a prompt of %d full blocks", n, nTok/model.BlockSize())
	}
	return nil
}

// maxExtraDepth bounds the nesting of block_extra_keys tuples.
const maxExtraDepth = 8

// blockExtras converts per-block extra keys to the canonical encoding (it
// allocates; only multimodal requests pay it).
func blockExtras(in []*kvindexv1.ExtraKeys) ([]events.ExtraKeys, error) {
	out := make([]events.ExtraKeys, len(in))
	for i, ek := range in {
		if len(ek.GetValues()) == 0 {
			continue // None
		}
		b, err := appendExtraTuple(nil, ek, 0)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "block_extra_keys[%d]: %v", i, err)
		}
		out[i] = b
	}
	return out, nil
}

func appendExtraTuple(dst []byte, ek *kvindexv1.ExtraKeys, depth int) ([]byte, error) {
	if depth > maxExtraDepth {
		return nil, fmt.Errorf("tuples nested deeper than %d", maxExtraDepth)
	}
	dst = events.AppendTuple(dst, len(ek.GetValues()))
	for j, v := range ek.GetValues() {
		switch k := v.GetKind().(type) {
		case *kvindexv1.ExtraValue_Str:
			dst = events.AppendString(dst, k.Str)
		case *kvindexv1.ExtraValue_Int:
			dst = events.AppendInt(dst, k.Int)
		case *kvindexv1.ExtraValue_Raw:
			dst = events.AppendBytes(dst, k.Raw)
		case *kvindexv1.ExtraValue_Tuple:
			var err error
			if dst, err = appendExtraTuple(dst, k.Tuple, depth+1); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("values[%d]: empty value", j)
		}
	}
	return dst, nil
}

func (s *Server) unknownModel(name string) error {
	ms := s.ix.Models()
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	sort.Strings(names)
	known := strings.Join(names, ", ")
	defaults.Zero(&known, "none")
	return status.Errorf(codes.InvalidArgument, "model: unknown model %s; known: %s", quote.Q(name), quote.S(known))
}

// buildScoreResponse turns sc's ranking into the response, one slab per
// message kind: eight allocations (plus a string per worker with explain).
func (s *Server) buildScoreResponse(sc *scoreScratch, req *kvindexv1.ScoreRequest) *kvindexv1.ScoreResponse {
	res := &sc.res
	pol := &res.Policy
	blockSize := res.Model.BlockSize()
	n := len(res.Ranked)
	nMedia := 0
	for i := range res.Ranked {
		for _, b := range res.Ranked[i].Match.ByMedium {
			if b > 0 {
				nMedia++
			}
		}
	}
	scores := make([]kvindexv1.WorkerScore, n)
	refs := make([]kvindexv1.WorkerRef, n)
	loads := make([]kvindexv1.LoadDetail, n)
	out := make([]*kvindexv1.WorkerScore, n)
	media := make([]kvindexv1.MediumMatch, nMedia)
	mediaOut := make([]*kvindexv1.MediumMatch, nMedia)
	next := 0
	for i := range res.Ranked {
		c := &res.Ranked[i]
		m := &c.Match
		refs[i].Pod = c.Ref.Pod
		refs[i].DpRank = uint32(c.Ref.DPRank)
		ws := &scores[i]
		ws.Worker = &refs[i]
		ws.MatchedBlocks = clampU32(m.Blocks)
		ws.MatchedTokens = clampU32(m.Blocks * blockSize)
		ws.SpeculativeBlocks = clampU32(c.Speculative)
		ws.Health = toHealth(c.Health)
		ws.Overlap, ws.Penalty, ws.Score = c.Overlap, c.Penalty, c.Score
		ld := &loads[i]
		ld.Running, ld.Waiting, ld.KvCacheUsage = c.Load.Running, c.Load.Waiting, c.Load.KVUsage
		ld.InflightRequests, ld.InflightPrefillTokens = c.Load.InflightRequests, c.Load.InflightPrefillTokens
		ld.QueuedPrefillTokens = uint64(c.Queue)
		ld.Source = c.Load.Source
		if ld.Source == "" {
			ld.Source = "none"
		}
		ws.Load = ld
		if req.GetExplain() {
			ws.Reason = pol.Explain(res.Prompt, c)
		}
		if m.Prefix > 0 {
			ws.PrefixBlocks = clampU32(m.Prefix)
			if g, ok := res.CapGroup(c); ok {
				ws.CappedBy = groupStatus(&g)
			}
		}
		first := next
		for med, b := range m.ByMedium {
			if b == 0 {
				continue
			}
			mm := &media[next]
			mm.Medium = events.Medium(med).String()
			mm.Blocks = clampU32(b)
			mm.Tokens = clampU32(b * blockSize)
			mediaOut[next] = mm
			next++
		}
		if next > first {
			ws.ByMedium = mediaOut[first:next:next]
		}
		out[i] = ws
	}
	return &kvindexv1.ScoreResponse{
		BlockSize:    clampU32(blockSize),
		PromptBlocks: clampU32(len(res.Keys)),
		Workers:      out,
		Policy:       pol.Name.String(),
	}
}

// groupStatus is g in the API's terms.
func groupStatus(g *indexer.Group) *kvindexv1.KVCacheGroup {
	return &kvindexv1.KVCacheGroup{Index: uint32(g.Index), Kind: g.Kind, Role: g.Role(), BlockSize: clampU32(g.BlockSize),
		SlidingWindow: clampU32(g.Window), ResidentBlocks: clampU64(g.Blocks)}
}

// clampU32 converts a non-negative count to uint32, saturating.
func clampU32(n int) uint32 {
	if n < 0 {
		return 0
	}
	if uint64(n) > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}

// clampU64 converts a counter to uint64, negative as 0.
func clampU64(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

// ListWorkers implements kvindexv1.IndexServiceServer: every worker of the
// index or the transport, both sides' counters merged. Cost: O(workers log
// workers), allocating per worker.
func (s *Server) ListWorkers(ctx context.Context, req *kvindexv1.ListWorkersRequest) (*kvindexv1.ListWorkersResponse, error) {
	filter := req.GetModel()
	if filter != "" {
		if _, ok := s.ix.Model(filter); !ok {
			return nil, s.unknownModel(filter)
		}
	}
	// Streams first: they count a batch once applied, so every batch listed
	// is in the block counts.
	var streams []events.WorkerStats
	if s.stats != nil {
		streams = s.stats.WorkerStats()
	}
	byRef := make(map[events.WorkerRef]*kvindexv1.WorkerStatus)
	refs := make([]events.WorkerRef, 0)
	for _, w := range s.ix.Workers() {
		info := w.Info()
		if filter != "" && info.Model != filter {
			continue
		}
		st := w.Stats()
		ws := &kvindexv1.WorkerStatus{
			Worker:              toRef(info.Ref),
			Model:               info.Model,
			Endpoint:            info.Endpoint,
			ResidentBlocks:      clampU64(st.ResidentBlocks),
			BlocksStored:        clampU64(st.BlocksStored),
			BlocksRemoved:       clampU64(st.BlocksRemoved),
			Orphans:             clampU64(st.Orphans),
			UnknownBlocks:       clampU64(st.UnknownBlocks),
			BlockSizeMismatches: clampU64(st.BlockSizeMismatches),
			InvalidEvents:       clampU64(st.InvalidEvents),
			SkippedGroupEvents:  clampU64(st.SkippedGroupEvents),
			Clears:              clampU64(st.Clears),
			Resets:              clampU64(st.Resets),
			LastReset:           st.LastReset,
			Evictions:           clampU64(st.Evictions - st.BudgetEvictions), // capacity only: each reason once
			BudgetEvictions:     clampU64(st.BudgetEvictions),
			Capacity:            clampU64(st.Capacity),
			BlockSize:           clampU32(st.BlockSize),
			ModelBlockSize:      clampU32(w.Model().BlockSize()),
			UnknownGroupBlocks:  clampU64(st.UnknownGroupBlocks),
			LayoutChanges:       clampU64(st.LayoutChanges),
			SideBlocks:          clampU64(st.SideBlocks),
			SideRefused:         clampU64(st.SideRefused),
		}
		for _, g := range w.Groups() {
			ws.Groups = append(ws.Groups, groupStatus(&g))
		}
		for m, n := range st.ResidentByMedium {
			if n > 0 {
				ws.ResidentByMedium = append(ws.ResidentByMedium, &kvindexv1.MediumCount{
					Medium: events.Medium(m).String(),
					Blocks: uint64(n),
				})
			}
		}
		if !st.LastApply.IsZero() {
			ws.LastEventTime = timestamppb.New(st.LastApply)
		}
		if req.GetDigests() {
			ws.Digest, ws.HasDigest = w.Digest(), true
		}
		if t := s.scorer.Tracker(); t != nil {
			ws.InflightRequests, ws.InflightPrefillTokens = t.Load(w.ID(), w.Gen())
		}
		ws.ScoredPromptTokens, ws.PredictedHitTokens = s.hits.workerCounts(w.ID(), w.Gen())
		byRef[info.Ref] = ws
		refs = append(refs, info.Ref)
	}
	for _, st := range streams {
		ws, ok := byRef[st.Worker]
		if !ok {
			if filter != "" {
				continue // the index does not know its model
			}
			ws = &kvindexv1.WorkerStatus{Worker: toRef(st.Worker)}
			byRef[st.Worker] = ws
			refs = append(refs, st.Worker)
		}
		mergeStreamStats(ws, &st)
	}
	slices.SortFunc(refs, scoring.CompareRefs)
	resp := &kvindexv1.ListWorkersResponse{Workers: make([]*kvindexv1.WorkerStatus, len(refs))}
	for i, r := range refs {
		resp.Workers[i] = byRef[r]
	}
	return resp, nil
}

// wireHealth maps a worker's health to the wire enum (UNKNOWN: UNSPECIFIED).
var wireHealth = [events.NumHealth]kvindexv1.WorkerHealth{
	events.HealthOK:         kvindexv1.WorkerHealth_WORKER_HEALTH_OK,
	events.HealthRecovering: kvindexv1.WorkerHealth_WORKER_HEALTH_RECOVERING,
	events.HealthUnsynced:   kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED,
	events.HealthStale:      kvindexv1.WorkerHealth_WORKER_HEALTH_STALE,
	events.HealthConflict:   kvindexv1.WorkerHealth_WORKER_HEALTH_CONFLICT,
	events.HealthDegraded:   kvindexv1.WorkerHealth_WORKER_HEALTH_DEGRADED,
}

func toHealth(h events.Health) kvindexv1.WorkerHealth {
	if int(h) < len(wireHealth) {
		return wireHealth[h]
	}
	return kvindexv1.WorkerHealth_WORKER_HEALTH_UNSPECIFIED
}

// mergeStreamStats copies the subscriber's side of a worker into ws.
func mergeStreamStats(ws *kvindexv1.WorkerStatus, st *events.WorkerStats) {
	if st.Endpoint != "" {
		ws.Endpoint = st.Endpoint
	}
	ws.Topic = st.Topic
	ws.LastSeq = st.LastSeq
	ws.HasSeq = st.HasSeq
	if !st.LastMessage.IsZero() {
		ws.LastEventTime = timestamppb.New(st.LastMessage)
	}
	ws.Batches = clampU64(st.Batches)
	ws.Events = clampU64(st.Events)
	ws.Gaps = clampU64(st.Gaps)
	ws.MissedBatches = clampU64(st.MissedBatches)
	ws.Restarts = clampU64(st.Restarts)
	ws.DecodeErrors = clampU64(st.DecodeErrors)
	ws.ApplyErrors = clampU64(st.ApplyErrors)
	ws.LastError = st.LastError
	ws.ReplayEndpoint = st.ReplayEndpoint
	ws.Health = toHealth(st.Health)
	ws.Connected = st.Connected
	if !st.StaleSince.IsZero() {
		ws.StaleSince = timestamppb.New(st.StaleSince)
	}
	ws.StaleTransitions = clampU64(st.StaleTransitions)
	ws.Replays = clampU64(st.Replays)
	ws.ReplayedBatches = clampU64(st.ReplayedBatches)
	ws.ReplayFailures = clampU64(st.ReplayFailures)
	ws.UnrecoveredGaps = clampU64(st.UnrecoveredGaps)
	ws.StaleReplays = clampU64(st.StaleReplays)
	ws.ReplayContinuations = clampU64(st.ReplayContinuations)
	ws.HealthReason = st.HealthReason
	ws.Duplicates = clampU64(st.Duplicates)
	ws.Conflicts = clampU64(st.Conflicts)
	// Names from the wire may be any bytes; a proto string must be UTF-8.
	ws.UnknownEvents = clampU64(st.UnknownEvents)
	ws.LastUnknownEvent = strings.ToValidUTF8(st.UnknownTag, "\uFFFD")
	ws.UnknownMediumEvents = clampU64(st.UnknownMediumEvents)
	ws.UnknownMedia = nil
	for _, n := range st.UnknownMedia {
		ws.UnknownMedia = append(ws.UnknownMedia, strings.ToValidUTF8(n, "\uFFFD"))
	}
	ws.JoinedAtSeq = st.JoinedAtSeq
	ws.Dropped = clampU64(st.Dropped)
	ws.Backlog = uint64(max(0, st.Backlog))
}

func toRef(r events.WorkerRef) *kvindexv1.WorkerRef {
	return &kvindexv1.WorkerRef{Pod: r.Pod, DpRank: uint32(r.DPRank)}
}
