package api

import (
	"context"
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

// Options configures a Server. The zero value is usable.
type Options struct {
	// MaxTokens is the largest token_ids a Score accepts; 0 means
	// DefaultMaxTokens.
	MaxTokens int
	// MaxBlockKeys is the largest block_keys a Score accepts; 0 means
	// DefaultMaxBlockKeys.
	MaxBlockKeys int
	// MaxCandidates is the largest candidate worker list a Score accepts;
	// 0 means DefaultMaxCandidates.
	MaxCandidates int
	// IncludeStale keeps stale workers in Score answers, flagged
	// WORKER_HEALTH_STALE; by default they are left out unless the request
	// names them as candidates.
	IncludeStale bool
	// Policy is the ranking policy requests start from; the zero value
	// means scoring.DefaultPolicy() (cache_aware, cost guard).
	Policy *scoring.Policy
	// Tracker records Route decisions (speculative blocks, in-flight
	// load); nil means a tracker with default TTLs that nothing sweeps but
	// Release and Record (the daemon passes one it sweeps).
	Tracker *scoring.Tracker
	// Loads holds scraped engine load; nil means none.
	Loads *scoring.LoadBoard
	// Registerer, when not nil, receives the Score metrics
	// (kvindex_score_duration_seconds, kvindex_score_requests_total{code}).
	Registerer prometheus.Registerer
}

// Server implements kvindexv1.IndexServiceServer over an index and, when
// available, the subscriber's per-worker stream statistics.
//
// # Memory
//
// A Score allocates only its response (a fixed number of slabs whatever the
// number of workers); key and match scratch is pooled and reused.
type Server struct {
	kvindexv1.UnimplementedIndexServiceServer

	ix      *indexer.Index
	stats   events.StatsSource // may be nil
	opts    Options
	metrics *metrics // nil without Options.Registerer
	health  *health.Server

	// table caches the index's workers by id and by ref. Workers are only
	// ever appended to an Index, so a cached table is stale exactly when
	// the index has a worker with id len(table.refs).
	table   atomic.Pointer[workerTable]
	scratch sync.Pool // *scoreScratch
	codec   *Codec

	policy  scoring.Policy
	tracker *scoring.Tracker
	// avgPrompt is a moving average of prompt tokens (float64 bits), the
	// size assumed for one waiting request of unknown length.
	avgPrompt atomic.Uint64
}

// workerTable is an immutable snapshot of an index's workers.
type workerTable struct {
	refs   []events.WorkerRef   // by WorkerID
	models []*indexer.Model     // by WorkerID
	health []*events.HealthCell // by WorkerID; nil cells read as unknown
	byRef  map[events.WorkerRef]indexer.WorkerID
}

// NewServer returns a Server over ix. stats may be nil, in which case
// ListWorkers reports only the index's counters. It panics if
// opts.Registerer rejects the metrics for a reason other than their being
// registered already (as prometheus.MustRegister does); already registered
// metrics are shared.
func NewServer(ix *indexer.Index, stats events.StatsSource, opts Options) *Server {
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = DefaultMaxTokens
	}
	if opts.MaxBlockKeys <= 0 {
		opts.MaxBlockKeys = DefaultMaxBlockKeys
	}
	if opts.MaxCandidates <= 0 {
		opts.MaxCandidates = DefaultMaxCandidates
	}
	s := &Server{
		ix:      ix,
		stats:   stats,
		opts:    opts,
		health:  health.NewServer(),
		policy:  scoring.DefaultPolicy(),
		tracker: opts.Tracker,
		codec:   NewCodec(),
	}
	if opts.Policy != nil {
		s.policy = *opts.Policy
	}
	if s.tracker == nil {
		s.tracker = scoring.NewTracker(0, 0, nil)
	}
	s.avgPrompt.Store(math.Float64bits(2048))
	if opts.Registerer != nil {
		s.metrics = newMetrics(opts.Registerer)
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(kvindexv1.IndexService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Register registers the IndexService, the standard health service
// (SERVING for "" and "kvindex.v1.IndexService") and server reflection on g.
// Call it before g.Serve.
func (s *Server) Register(g *grpc.Server) {
	kvindexv1.RegisterIndexServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
}

// Health returns the health service Register installs, so that the daemon
// can report NOT_SERVING while it drains (health.Server.Shutdown).
func (s *Server) Health() *health.Server { return s.health }

// workerTable returns a table that holds every worker added to the index
// before the call. Cost: one index read lock when the cached table is
// current; O(workers) and a few allocations when a worker was added.
func (s *Server) workerTable() *workerTable {
	t := s.table.Load()
	if t != nil && s.ix.Worker(indexer.WorkerID(len(t.refs))) == nil {
		return t
	}
	ws := s.ix.Workers()
	t = &workerTable{
		refs:   make([]events.WorkerRef, len(ws)),
		models: make([]*indexer.Model, len(ws)),
		health: make([]*events.HealthCell, len(ws)),
		byRef:  make(map[events.WorkerRef]indexer.WorkerID, len(ws)),
	}
	hs, _ := s.stats.(events.HealthSource)
	for _, w := range ws {
		id := w.ID()
		t.refs[id] = w.Info().Ref
		t.models[id] = w.Model()
		t.byRef[t.refs[id]] = id
		if hs != nil {
			t.health[id] = hs.Health(t.refs[id])
		}
	}
	s.table.Store(t)
	return t
}

// candidate states in scoreScratch.state.
const (
	notCandidate uint8 = iota
	candidate
	candidateMatched
)

// scoreScratch is one Score's reusable working memory. It lives in
// Server.scratch between requests; nothing in it outlives a request.
type scoreScratch struct {
	keys    []indexer.Key
	matches []indexer.Match
	extras  indexer.PromptExtras
	// state is indexed by WorkerID: whether the worker is a candidate of
	// this request. All zero between requests.
	state []uint8
	cands []indexer.WorkerID // ids whose state is set, to reset them
	// listed is indexed by WorkerID: whether the worker is already among
	// ranked. All false between requests.
	listed []bool
	ranked []scoring.Candidate
	specs  []spec
	loads  map[events.WorkerRef]*kvindexv1.WorkerLoad

	// Set per request, read by allow and compare.
	model        *indexer.Model
	tab          *workerTable
	filtered     bool
	includeStale bool

	// Method values bound once, so that passing them allocates nothing.
	allowFn func(indexer.WorkerID) bool
	specFn  func(indexer.WorkerID, int)
}

// spec is one worker's speculative prefix of the prompt.
type spec struct {
	w      indexer.WorkerID
	blocks int
}

// visitSpec collects the tracker's speculative prefixes.
func (sc *scoreScratch) visitSpec(w indexer.WorkerID, blocks int) {
	sc.specs = append(sc.specs, spec{w, blocks})
}

func (s *Server) getScratch() *scoreScratch {
	if sc, ok := s.scratch.Get().(*scoreScratch); ok {
		return sc
	}
	sc := &scoreScratch{}
	sc.allowFn = sc.allow
	sc.specFn = sc.visitSpec
	return sc
}

// putScratch resets sc and returns it to the pool. Scratch grown for a
// huge prompt is dropped rather than pinned in the pool.
func (s *Server) putScratch(sc *scoreScratch) {
	for _, id := range sc.cands {
		sc.state[id] = notCandidate
	}
	sc.cands = sc.cands[:0]
	for i := range sc.ranked {
		sc.listed[sc.ranked[i].Match.Worker] = false
	}
	sc.ranked, sc.specs, sc.loads = sc.ranked[:0], sc.specs[:0], nil
	sc.extras = indexer.PromptExtras{}
	sc.model, sc.tab, sc.filtered, sc.includeStale = nil, nil, false, false
	if cap(sc.keys) > 1<<16 {
		sc.keys = nil
	}
	s.scratch.Put(sc)
}

// allow is the Match filter: a worker of the request's model, or one of its
// candidates. Workers added after the table was taken are skipped.
func (sc *scoreScratch) allow(id indexer.WorkerID) bool {
	if int(id) >= len(sc.tab.models) {
		return false
	}
	if sc.filtered {
		return sc.state[id] != notCandidate
	}
	if !sc.includeStale && sc.tab.health[id].Load() == events.HealthStale {
		return false
	}
	return sc.tab.models[id] == sc.model
}

// Score implements kvindexv1.IndexServiceServer: each worker's longest
// consecutive resident prefix of the prompt, ranked by the policy.
//
// Cost: O(tokens) hashing for token_ids (about 10 ns per 16-token block),
// then indexer.Index.Match (grows with the matched prefix), one tracker
// probe for speculative prefixes, and O(w log w) to rank w workers. It
// allocates only the response (a fixed number of slabs whatever w is,
// nothing per block), plus the reasons when explain is set.
func (s *Server) Score(ctx context.Context, req *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	start := time.Now()
	sc, pol, err := s.rank(req, req.GetPolicy() != nil)
	if err != nil {
		s.metrics.observe(start, err)
		return nil, err
	}
	resp := s.buildScoreResponse(sc, &pol, req)
	s.putScratch(sc)
	s.metrics.observe(start, nil)
	return resp, nil
}

// rank validates req, matches its prompt and ranks the workers into
// sc.ranked, best first. With all set (a policy was given, or Route), every
// allowed worker of the model is ranked, matched or not. The caller owns
// the returned scratch and must putScratch it.
func (s *Server) rank(req *kvindexv1.ScoreRequest, all bool) (*scoreScratch, scoring.Policy, error) {
	model, err := s.checkScoreRequest(req)
	if err != nil {
		return nil, scoring.Policy{}, err
	}
	pol := s.policy
	if p := req.GetPolicy(); p != nil {
		pol, err = scoring.Override{
			Name: p.GetName(), GPUWeight: p.GetGpuWeight(), CPUWeight: p.GetCpuWeight(), StorageWeight: p.GetStorageWeight(),
			LoadWeight: p.GetLoadWeight(), Guard: p.GetGuard(), StaticK: p.GetStaticK(),
		}.Apply(s.policy)
		if err != nil {
			return nil, pol, status.Error(codes.InvalidArgument, "policy."+err.Error())
		}
	}
	sc := s.getScratch()
	sc.model = model
	sc.tab = s.workerTable()
	sc.includeStale = s.opts.IncludeStale
	if err := s.markCandidates(sc, req.GetWorkers()); err != nil {
		s.putScratch(sc)
		return nil, pol, err
	}
	if err := s.markLoads(sc, req.GetLoads()); err != nil {
		s.putScratch(sc)
		return nil, pol, err
	}

	if len(req.GetTokenIds()) > 0 {
		var extras *indexer.PromptExtras
		if req.GetLoraName() != "" || req.GetCacheSalt() != "" || len(req.GetBlockExtraKeys()) > 0 {
			sc.extras = indexer.PromptExtras{LoRAName: req.GetLoraName(), CacheSalt: req.GetCacheSalt()}
			if len(req.GetBlockExtraKeys()) > 0 {
				bx, err := blockExtras(req.GetBlockExtraKeys())
				if err != nil {
					s.putScratch(sc)
					return nil, pol, err
				}
				sc.extras.BlockExtras = bx
			}
			extras = &sc.extras
		}
		sc.keys = indexer.PromptKeys(model.Name, model.BlockSize, req.GetTokenIds(), extras, sc.keys[:0])
		s.notePrompt(len(req.GetTokenIds()))
	} else {
		sc.keys = slices.Grow(sc.keys[:0], len(req.GetBlockKeys()))
		for _, k := range req.GetBlockKeys() {
			sc.keys = append(sc.keys, indexer.Key(k))
		}
	}

	sc.matches = s.ix.Match(sc.keys, sc.allowFn, sc.matches[:0])
	if n := len(sc.tab.refs); len(sc.listed) < n {
		sc.listed = append(sc.listed, make([]bool, n-len(sc.listed))...)
	}
	for _, m := range sc.matches {
		sc.add(m, 0)
	}
	// Speculative prefixes from recent routes extend (or add) matches.
	s.tracker.Speculative(sc.keys, sc.specFn)
	for _, sp := range sc.specs {
		if int(sp.w) >= len(sc.listed) || !sc.allow(sp.w) {
			continue
		}
		if !sc.listed[sp.w] {
			var m indexer.Match
			m.Worker = sp.w
			sc.add(m, 0)
		}
		for i := range sc.ranked {
			c := &sc.ranked[i]
			if c.Match.Worker != sp.w || sp.blocks <= c.Match.Blocks {
				continue
			}
			c.Speculative = sp.blocks - c.Match.Blocks
			c.Match.Blocks = sp.blocks
			c.Match.ByMedium[events.MediumGPU] = max(c.Match.ByMedium[events.MediumGPU], sp.blocks)
		}
	}
	switch {
	case sc.filtered:
		// Every candidate appears, matched or not.
		for _, id := range sc.cands {
			if !sc.listed[id] {
				sc.add(indexer.Match{Worker: id}, 0)
			}
		}
	case all:
		for id, m := range sc.tab.models {
			if m == model && !sc.listed[id] && sc.allow(indexer.WorkerID(id)) {
				sc.add(indexer.Match{Worker: indexer.WorkerID(id)}, 0)
			}
		}
	}
	now := time.Now()
	for i := range sc.ranked {
		s.loadOf(sc, &sc.ranked[i], now)
	}
	pol.Rank(s.prompt(sc, req), sc.ranked, sc.tab.refs)
	return sc, pol, nil
}

// add lists a worker for ranking once.
func (sc *scoreScratch) add(m indexer.Match, speculative int) {
	sc.listed[m.Worker] = true
	sc.ranked = append(sc.ranked, scoring.Candidate{Match: m, Speculative: speculative})
}

// prompt describes the request for the policy.
func (s *Server) prompt(sc *scoreScratch, req *kvindexv1.ScoreRequest) scoring.Prompt {
	return scoring.Prompt{
		Blocks:          len(sc.keys),
		Tokens:          max(len(req.GetTokenIds()), len(sc.keys)*sc.model.BlockSize),
		BlockSize:       sc.model.BlockSize,
		AvgPromptTokens: math.Float64frombits(s.avgPrompt.Load()),
	}
}

// notePrompt folds a prompt length into the moving average (weight 1/64).
func (s *Server) notePrompt(tokens int) {
	for {
		old := s.avgPrompt.Load()
		avg := math.Float64frombits(old)
		next := avg + (float64(tokens)-avg)/64
		if s.avgPrompt.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// loadOf fills a candidate's load: the request's own figures first, then a
// fresh scrape, plus kvindex's in-flight accounting.
func (s *Server) loadOf(sc *scoreScratch, c *scoring.Candidate, now time.Time) {
	ref := sc.tab.refs[c.Match.Worker]
	l := &c.Load
	if wl := sc.loads[ref]; wl != nil {
		l.Running, l.Waiting, l.KVUsage, l.QueuedPrefillTokens = wl.GetRunning(), wl.GetWaiting(), wl.GetKvCacheUsage(), wl.GetQueuedPrefillTokens()
		l.Source = "request"
	} else if sl, ok := s.opts.Loads.Get(ref, now); ok {
		l.Running, l.Waiting, l.KVUsage = sl.Running, sl.Waiting, sl.KVUsage
		l.Source = "scrape"
	}
	l.InflightRequests, l.InflightPrefillTokens = s.tracker.Load(c.Match.Worker)
}

// markLoads indexes the request's worker loads, checking each names a
// worker of the model.
func (s *Server) markLoads(sc *scoreScratch, loads []*kvindexv1.WorkerLoad) error {
	if len(loads) == 0 {
		return nil
	}
	sc.loads = make(map[events.WorkerRef]*kvindexv1.WorkerLoad, len(loads))
	for i, wl := range loads {
		r := wl.GetWorker()
		ref := events.WorkerRef{Pod: r.GetPod(), DPRank: int(r.GetDpRank())}
		if id, ok := sc.tab.byRef[ref]; !ok || sc.tab.models[id] != sc.model {
			return status.Errorf(codes.InvalidArgument, "loads[%d].worker: unknown worker %s for model %q", i, ref, sc.model.Name)
		}
		if u := wl.GetKvCacheUsage(); u < 0 || u > 1 || math.IsNaN(u) {
			return status.Errorf(codes.InvalidArgument, "loads[%d].kv_cache_usage: %v is not in [0, 1]", i, u)
		}
		sc.loads[ref] = wl
	}
	return nil
}

// Route implements kvindexv1.IndexServiceServer: rank like Score (every
// worker of the model), choose the best (or the caller's pick), and record
// the choice so that the request's blocks count as speculatively cached
// there and its uncached prefill as in-flight load.
func (s *Server) Route(ctx context.Context, req *kvindexv1.RouteRequest) (*kvindexv1.RouteResponse, error) {
	if req.GetRequestId() == "" {
		return nil, status.Error(codes.InvalidArgument, "request_id: required")
	}
	if req.GetScore() == nil {
		return nil, status.Error(codes.InvalidArgument, "score: required")
	}
	sc, pol, err := s.rank(req.GetScore(), true)
	if err != nil {
		return nil, err
	}
	defer s.putScratch(sc)
	chosen := -1
	if p := req.GetPick(); p != nil {
		ref := events.WorkerRef{Pod: p.GetPod(), DPRank: int(p.GetDpRank())}
		id, ok := sc.tab.byRef[ref]
		if !ok || sc.tab.models[id] != sc.model {
			return nil, status.Errorf(codes.InvalidArgument, "pick: unknown worker %s for model %q", ref, sc.model.Name)
		}
		for i := range sc.ranked {
			if sc.ranked[i].Match.Worker == id {
				chosen = i
			}
		}
		if chosen < 0 { // a stale or filtered-out worker the router chose anyway
			sc.add(indexer.Match{Worker: id}, 0)
			s.loadOf(sc, &sc.ranked[len(sc.ranked)-1], time.Now())
			pol.Rank(s.prompt(sc, req.GetScore()), sc.ranked, sc.tab.refs)
			for i := range sc.ranked {
				if sc.ranked[i].Match.Worker == id {
					chosen = i
				}
			}
		}
	} else if len(sc.ranked) > 0 {
		chosen = 0
	}
	if chosen < 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "score.model: no worker of model %q is available (all stale or none configured)", sc.model.Name)
	}
	c := &sc.ranked[chosen]
	if err := s.tracker.Record(req.GetRequestId(), c.Match.Worker, sc.keys, uint64(c.Own)); err != nil {
		return nil, status.Errorf(codes.AlreadyExists, "request_id: %v", err)
	}
	resp := s.buildScoreResponse(sc, &pol, req.GetScore())
	return &kvindexv1.RouteResponse{Chosen: resp.Workers[chosen].GetWorker(), Ranking: resp}, nil
}

// Release implements kvindexv1.IndexServiceServer.
func (s *Server) Release(ctx context.Context, req *kvindexv1.ReleaseRequest) (*kvindexv1.ReleaseResponse, error) {
	if req.GetRequestId() == "" {
		return nil, status.Error(codes.InvalidArgument, "request_id: required")
	}
	return &kvindexv1.ReleaseResponse{Released: s.tracker.Release(req.GetRequestId())}, nil
}

// checkScoreRequest validates everything that needs no worker table and
// returns the request's model.
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
	switch {
	case nTok > 0 && nKeys > 0:
		return nil, status.Error(codes.InvalidArgument, "token_ids, block_keys: give exactly one")
	case nTok == 0 && nKeys == 0:
		return nil, status.Error(codes.InvalidArgument, "token_ids: required (or block_keys)")
	case nTok > s.opts.MaxTokens:
		return nil, status.Errorf(codes.InvalidArgument, "token_ids: %d tokens exceed the limit of %d", nTok, s.opts.MaxTokens)
	case nKeys > s.opts.MaxBlockKeys:
		return nil, status.Errorf(codes.InvalidArgument, "block_keys: %d keys exceed the limit of %d", nKeys, s.opts.MaxBlockKeys)
	}
	if n := len(req.GetWorkers()); n > s.opts.MaxCandidates {
		return nil, status.Errorf(codes.InvalidArgument, "workers: %d candidates exceed the limit of %d", n, s.opts.MaxCandidates)
	}
	if n := len(req.GetBlockExtraKeys()); n > 0 && n > nTok/model.BlockSize {
		return nil, status.Errorf(codes.InvalidArgument, "block_extra_keys: %d entries for a prompt of %d full blocks", n, nTok/model.BlockSize)
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

// maxExtraDepth bounds the nesting of block_extra_keys tuples.
const maxExtraDepth = 8

// blockExtras converts the request's per-block extra keys to the canonical
// encoding the index hashes. It allocates; only multimodal requests pay it.
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

// unknownModel is the InvalidArgument error for a model the index lacks.
func (s *Server) unknownModel(name string) error {
	ms := s.ix.Models()
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	sort.Strings(names)
	known := strings.Join(names, ", ")
	if known == "" {
		known = "none"
	}
	return status.Errorf(codes.InvalidArgument, "model: unknown model %q; known: %s", name, known)
}

// markCandidates records the request's candidate workers in sc, checking
// that each is a worker of sc.model. Duplicates are kept once.
func (s *Server) markCandidates(sc *scoreScratch, refs []*kvindexv1.WorkerRef) error {
	if len(refs) == 0 {
		return nil
	}
	sc.filtered = true
	if n := len(sc.tab.refs); len(sc.state) < n {
		sc.state = append(sc.state, make([]uint8, n-len(sc.state))...)
	}
	for i, r := range refs {
		if r.GetPod() == "" {
			return status.Errorf(codes.InvalidArgument, "workers[%d].pod: required", i)
		}
		if r.GetDpRank() > math.MaxInt32 {
			return status.Errorf(codes.InvalidArgument, "workers[%d].dp_rank: %d is out of range", i, r.GetDpRank())
		}
		ref := events.WorkerRef{Pod: r.GetPod(), DPRank: int(r.GetDpRank())}
		id, ok := sc.tab.byRef[ref]
		if !ok {
			return status.Errorf(codes.InvalidArgument, "workers[%d]: unknown worker %s for model %q", i, ref, sc.model.Name)
		}
		if m := sc.tab.models[id]; m != sc.model {
			return status.Errorf(codes.InvalidArgument, "workers[%d]: unknown worker %s for model %q (it serves %q)", i, ref, sc.model.Name, m.Name)
		}
		if sc.state[id] == notCandidate {
			sc.state[id] = candidate
			sc.cands = append(sc.cands, id)
		}
	}
	return nil
}

// buildScoreResponse turns sc.ranked into the response. All messages of
// one kind share one slab: eight allocations in all (plus one string per
// worker with explain).
func (s *Server) buildScoreResponse(sc *scoreScratch, pol *scoring.Policy, req *kvindexv1.ScoreRequest) *kvindexv1.ScoreResponse {
	blockSize := sc.model.BlockSize
	n := len(sc.ranked)
	nMedia := 0
	for i := range sc.ranked {
		for _, b := range sc.ranked[i].Match.ByMedium {
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
	pr := s.prompt(sc, req)
	next := 0
	for i := range sc.ranked {
		c := &sc.ranked[i]
		m := &c.Match
		ref := sc.tab.refs[m.Worker]
		refs[i].Pod = ref.Pod
		refs[i].DpRank = uint32(ref.DPRank)
		ws := &scores[i]
		ws.Worker = &refs[i]
		ws.MatchedBlocks = clampU32(m.Blocks)
		ws.MatchedTokens = clampU32(m.Blocks * blockSize)
		ws.SpeculativeBlocks = clampU32(c.Speculative)
		ws.Health = toHealth(sc.tab.health[m.Worker].Load())
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
			ws.Reason = pol.Explain(pr, c)
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
		PromptBlocks: clampU32(len(sc.keys)),
		Workers:      out,
		Policy:       pol.Name.String(),
	}
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

// clampU64 converts a counter to uint64; a negative value (never expected)
// reads as 0.
func clampU64(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

// ListWorkers implements kvindexv1.IndexServiceServer: every worker known
// to the index or to the subscriber, with both sides' counters merged by
// WorkerRef. Cost: O(workers log workers) and allocations per worker; it is
// an operator's call, not a router's.
func (s *Server) ListWorkers(ctx context.Context, req *kvindexv1.ListWorkersRequest) (*kvindexv1.ListWorkersResponse, error) {
	filter := req.GetModel()
	if filter != "" {
		if _, ok := s.ix.Model(filter); !ok {
			return nil, s.unknownModel(filter)
		}
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
			Evictions:           clampU64(st.Evictions),
			BudgetEvictions:     clampU64(st.BudgetEvictions),
			Capacity:            clampU64(st.Capacity),
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
		byRef[info.Ref] = ws
		refs = append(refs, info.Ref)
	}
	if s.stats != nil {
		for _, st := range s.stats.WorkerStats() {
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
	}
	slices.SortFunc(refs, scoring.CompareRefs)
	resp := &kvindexv1.ListWorkersResponse{Workers: make([]*kvindexv1.WorkerStatus, len(refs))}
	for i, r := range refs {
		resp.Workers[i] = byRef[r]
	}
	return resp, nil
}

// toHealth maps a worker's health to the wire enum.
func toHealth(h events.Health) kvindexv1.WorkerHealth {
	switch h {
	case events.HealthOK:
		return kvindexv1.WorkerHealth_WORKER_HEALTH_OK
	case events.HealthRecovering:
		return kvindexv1.WorkerHealth_WORKER_HEALTH_RECOVERING
	case events.HealthUnsynced:
		return kvindexv1.WorkerHealth_WORKER_HEALTH_UNSYNCED
	case events.HealthStale:
		return kvindexv1.WorkerHealth_WORKER_HEALTH_STALE
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
	ws.JoinedAtSeq = st.JoinedAtSeq
	ws.Dropped = clampU64(st.Dropped)
	ws.Backlog = uint64(max(0, st.Backlog))
}

func toRef(r events.WorkerRef) *kvindexv1.WorkerRef {
	return &kvindexv1.WorkerRef{Pod: r.Pod, DpRank: uint32(r.DPRank)}
}
