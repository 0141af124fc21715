package scoring

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/quote"
)

// ErrNoWorker is Route finding no worker of the model to choose.
var ErrNoWorker = errors.New("scoring: no worker available")

// RequestError is a request that names something wrong, with the field at
// fault as a path ("workers[2]", "pick"), as the gRPC API reports it.
type RequestError struct {
	Field string
	Msg   string
}

// Error returns "field: msg".
func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

func badField(field, format string, args ...any) error {
	return &RequestError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Options configure a Scorer. The zero value is usable.
type Options struct {
	Policy *Policy // the ranking policy requests start from; nil means DefaultPolicy().
	// Tracker records Route decisions; nil means a tracker with default
	// TTLs that only Release and Record sweep.
	Tracker *Tracker
	Loads   *LoadBoard          // holds scraped engine load; nil means none.
	Health  events.HealthSource // gives each worker's transport-side health; nil reads every worker as HealthUnknown.
	// IncludeStale keeps stale workers in answers; by default they are
	// left out unless the request names them as candidates.
	IncludeStale bool
	// NoGroupCaps matches a hybrid model's workers by their prefix group
	// alone: their window, mamba and other prefix groups do not cap hits
	// (Worker.Cap), as before kvindex modelled vLLM's coordinator. A kill
	// switch, and the baseline kvsim compares the hybrid rule with.
	NoGroupCaps bool
}

// Scorer is the ranking entry of kvindex (see the package documentation);
// its worker table caches each worker's health and load cells, and is
// rebuilt when the index's Version changes.
type Scorer struct {
	ix      *indexer.Index
	opts    Options
	policy  Policy
	tracker *Tracker

	table atomic.Pointer[workerTable]
	// avgPrompt is a moving average of prompt tokens (float64 bits), the
	// size assumed for a waiting request of unknown length.
	avgPrompt atomic.Uint64
	routes    sync.Map // holds each model's *routeStats (64 KiB each).
}

// routeStats is what Route learns of a model's traffic: its rate of
// routes, a moving average of the chosen worker's uncached prefill, and
// the rates of routes sharing each prefix. Fields are updated without a
// common lock (see rateCell).
type routeStats struct {
	routes rateCell
	avgOwn atomic.Uint64 // float64 bits, tokens; 0 before any
	shared sharedRates
	mu     sync.Mutex // the model's route lock (see the package documentation, Concurrency).
}

// ewma folds x into the float64 average at a with weight 1/64; the first
// value is taken as is.
func ewma(a *atomic.Uint64, x float64) {
	for {
		old := a.Load()
		avg := math.Float64frombits(old)
		next := x
		if old != 0 {
			next = avg + (x-avg)/64
		}
		if a.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// note records one route of keys at now with own uncached tokens.
func (r *routeStats) note(now time.Time, keys []indexer.Key, own float64) {
	ewma(&r.avgOwn, own)
	r.routes.note(now)
	r.shared.note(keys, now)
}

// stats returns the model's route statistics, creating them on first use.
func (s *Scorer) stats(m *indexer.Model) *routeStats {
	if v, ok := s.routes.Load(m); ok {
		return v.(*routeStats)
	}
	v, _ := s.routes.LoadOrStore(m, &routeStats{})
	return v.(*routeStats)
}

// workerTable is an immutable snapshot of the index's workers, by id; free
// ids have a nil model.
type workerTable struct {
	version  uint64
	refs     []events.WorkerRef
	gens     []uint32
	models   []*indexer.Model
	health   []*events.HealthCell // nil cells read as unknown
	loads    []*LoadCell          // nil cells read as no load
	workers  []*indexer.Worker    // nil for free ids
	byRef    map[events.WorkerRef]indexer.WorkerID
	perModel map[*indexer.Model]int
}

// New returns a Scorer over ix.
func New(ix *indexer.Index, opts Options) *Scorer {
	s := &Scorer{ix: ix, opts: opts, policy: DefaultPolicy(), tracker: opts.Tracker}
	if opts.Policy != nil {
		s.policy = *opts.Policy
	}
	if s.tracker == nil {
		s.tracker = NewTracker(TrackerOptions{})
	}
	s.avgPrompt.Store(math.Float64bits(2048))
	return s
}

// Policy returns the default policy requests start from.
func (s *Scorer) Policy() Policy { return s.policy }

// Tracker returns the tracker Route records into.
func (s *Scorer) Tracker() *Tracker { return s.tracker }

// Index returns the index the scorer reads.
func (s *Scorer) Index() *indexer.Index { return s.ix }

// workers returns a table that holds every worker the index had when the
// call began. Cost: two atomic loads while the cached table is current.
func (s *Scorer) workers() *workerTable {
	v := s.ix.Version()
	if t := s.table.Load(); t != nil && t.version == v {
		return t
	}
	ws := s.ix.Workers()
	n := s.ix.NumWorkers()
	t := &workerTable{
		version:  v,
		refs:     make([]events.WorkerRef, n),
		gens:     make([]uint32, n),
		models:   make([]*indexer.Model, n),
		health:   make([]*events.HealthCell, n),
		loads:    make([]*LoadCell, n),
		workers:  make([]*indexer.Worker, n),
		byRef:    make(map[events.WorkerRef]indexer.WorkerID, len(ws)),
		perModel: make(map[*indexer.Model]int),
	}
	for _, w := range ws {
		id := w.ID()
		if int(id) >= n {
			continue // added after n was read: the next call sees it
		}
		ref := w.Info().Ref
		t.refs[id], t.gens[id], t.models[id], t.workers[id] = ref, w.Gen(), w.Model(), w
		t.byRef[ref] = id
		t.perModel[w.Model()]++
		if s.opts.Health != nil {
			t.health[id] = s.opts.Health.Health(ref)
		}
		t.loads[id] = s.opts.Loads.Cell(ref)
	}
	s.table.Store(t)
	return t
}

// Request is one prompt to score.
type Request struct {
	Model *indexer.Model // the model the prompt is for; required.
	// Tokens are the prompt's token ids, or Keys its block keys; exactly
	// one is set.
	Tokens []uint32
	Keys   []indexer.Key
	Extras *indexer.PromptExtras // the keying extras of Tokens; nil for none.
	// Candidates, when set, restricts the answer to these workers of the
	// model, each listed whether it holds anything or not, stale or not.
	Candidates []events.WorkerRef
	Loads      []RequestLoad // the caller's figures for some workers, over scraped load.
	Policy     *Policy       // overrides the scorer's default policy; nil keeps it.
	// All lists every allowed worker of the model, matched or not;
	// otherwise only workers holding (or speculated to hold) the first
	// block appear.
	All bool
}

// RequestLoad is a caller's view of one worker's load.
type RequestLoad struct {
	Worker events.WorkerRef // the worker, which must serve the request's model.
	// Running and Waiting are requests on the engine.
	Running, Waiting    uint32
	KVUsage             float64 // the fraction of KV cache in use, in [0, 1].
	QueuedPrefillTokens uint64  // prompt tokens admitted but not prefilled (0: estimated).
}

// candidate states in Result.state.
const (
	notCandidate uint8 = iota
	candidate
)

// Result is a ranking, best first, and the working memory that produced
// it. Reuse one Result per goroutine: after the first calls a Score
// allocates nothing. A Result is valid until the next call.
type Result struct {
	Model  *indexer.Model
	Policy Policy
	Prompt Prompt // describes the prompt as the policy saw it.
	Keys   []indexer.Key
	Ranked []Candidate // the workers, best first; Ref, Gen and Health are set.

	matches []indexer.Match
	specs   []Spec
	tab     *workerTable
	// state, listed and loadAt are indexed by WorkerID, and all zero
	// between calls: whether the worker is a candidate, whether it is in
	// Ranked, and 1 + its index in the request's Loads (0 for none).
	state    []uint8
	cands    []indexer.WorkerID // ids whose state is set, to reset them
	listed   []bool
	loadAt   []int32
	loaded   []indexer.WorkerID
	filtered bool
	allowFn  func(indexer.WorkerID) bool
	incStale bool
	// keysReq is the request Cap's keysAtFn keys; altKeys its keys at
	// other block sizes, for this call.
	keysReq  *Request
	keysAtFn indexer.KeysAt
	altKeys  []altKeys
}

// reset clears the per-call state, keeping capacity (but not a huge
// prompt's keys).
func (r *Result) reset() {
	for _, id := range r.cands {
		r.state[id] = notCandidate
	}
	for _, id := range r.loaded {
		r.loadAt[id] = 0
	}
	for i := range r.Ranked {
		r.listed[r.Ranked[i].Match.Worker] = false
	}
	r.cands, r.loaded = r.cands[:0], r.loaded[:0]
	r.Ranked, r.specs, r.matches = r.Ranked[:0], r.specs[:0], r.matches[:0]
	r.filtered, r.tab, r.Model, r.keysReq = false, nil, nil, nil
	r.altKeys = r.altKeys[:0]
	if cap(r.Keys) > 1<<16 {
		r.Keys = nil
	}
	r.Keys = r.Keys[:0]
}

func grow[T any](s []T, n int) []T {
	if len(s) < n {
		s = append(s, make([]T, n-len(s))...)
	}
	return s
}

// allow is the Match filter: a candidate of the request, or else a worker
// of the request's model with trusted health (unless untrusted ones are
// included) and known to the table.
func (r *Result) allow(id indexer.WorkerID) bool {
	if int(id) >= len(r.tab.models) {
		return false
	}
	if r.filtered {
		return r.state[id] != notCandidate
	}
	if !r.incStale && !r.tab.health[id].Load().Trusted() {
		return false
	}
	return r.tab.models[id] == r.Model
}

// Score ranks the workers for req into res, or returns a *RequestError.
//
// Cost: hashing Tokens (about 8 ns per 16-token block), Match, one tracker
// shard probe, atomic loads per listed worker, and O(w log w) to rank; no
// allocation once res has grown to the request's size.
func (s *Scorer) Score(req *Request, res *Result) error {
	if err := s.rank(req, res); err != nil {
		res.reset()
		return err
	}
	return nil
}

func (s *Scorer) rank(req *Request, res *Result) error {
	res.reset()
	if req.Model == nil {
		return badField("model", "required")
	}
	if (len(req.Tokens) > 0) == (len(req.Keys) > 0) {
		return badField("token_ids", "give exactly one of tokens and block keys")
	}
	if res.allowFn == nil {
		res.allowFn, res.keysAtFn = res.allow, res.keysAt
	}
	res.Model = req.Model
	res.Policy = s.policy
	if req.Policy != nil {
		res.Policy = *req.Policy
	}
	tab := s.workers()
	res.tab = tab
	res.incStale = s.opts.IncludeStale
	n := len(tab.refs)
	res.state, res.listed, res.loadAt = grow(res.state, n), grow(res.listed, n), grow(res.loadAt, n)
	if err := res.markCandidates(req.Candidates); err != nil {
		return err
	}
	if err := res.markLoads(req.Loads); err != nil {
		return err
	}
	if len(req.Tokens) > 0 {
		res.Keys = req.Model.PromptKeys(req.Tokens, req.Extras, res.Keys[:0])
		ewma(&s.avgPrompt, float64(len(req.Tokens)))
	} else {
		res.Keys = append(res.Keys[:0], req.Keys...)
	}

	res.matches = s.ix.Match(res.Keys, res.allowFn, res.matches[:0])
	for _, m := range res.matches {
		if !s.opts.NoGroupCaps {
			m = res.capped(m, req)
		}
		res.add(m)
	}
	// Speculative prefixes from recent routes extend (or add) matches, past
	// what the worker's prefix group holds only: the blocks it holds were
	// announced, with every group's, so the capped match is the truth for
	// them (a route does not restore a window's evicted blocks).
	res.specs = s.tracker.Speculative(res.Keys, res.specs[:0])
	for _, sp := range res.specs {
		if int(sp.Worker) >= n || tab.gens[sp.Worker] != sp.Gen || !res.allow(sp.Worker) {
			continue
		}
		if !res.listed[sp.Worker] {
			res.add(indexer.Match{Worker: sp.Worker})
		}
		for i := range res.Ranked {
			c := &res.Ranked[i]
			if c.Match.Worker != sp.Worker || sp.Blocks <= max(c.Match.Blocks, c.Match.Prefix) {
				continue
			}
			c.Speculative = sp.Blocks - c.Match.Blocks
			c.Match.Blocks, c.Match.Prefix, c.Match.CappedBy = sp.Blocks, 0, 0
			c.Match.ByMedium[events.MediumGPU] = max(c.Match.ByMedium[events.MediumGPU], sp.Blocks)
		}
	}
	switch {
	case res.filtered:
		// Every candidate appears, matched or not.
		for _, id := range res.cands {
			if !res.listed[id] {
				res.add(indexer.Match{Worker: id})
			}
		}
	case req.All:
		for id, m := range tab.models {
			if m == req.Model && !res.listed[id] && res.allow(indexer.WorkerID(id)) {
				res.add(indexer.Match{Worker: indexer.WorkerID(id)})
			}
		}
	}
	now := time.Now()
	for i := range res.Ranked {
		s.loadOf(req, res, &res.Ranked[i], now)
	}
	res.Prompt = s.prompt(req, res, s.tracker.now())
	res.Policy.Rank(res.Prompt, res.Ranked, tab.refs)
	return nil
}

// capped applies the worker's hybrid cap to its match (indexer.Worker.Cap):
// a hit vLLM realizes only where every KV-cache group can serve it. The
// rule is applied at the longest hit the engine takes, one token short of
// a tokens prompt (it computes at least one; a keys prompt is taken
// whole), since a window's blocks before that cut are what it needs. Cost: an atomic
// load for a worker with one group (Cap's doc for the others).
func (r *Result) capped(m indexer.Match, req *Request) indexer.Match {
	w := r.tab.workers[m.Worker]
	if w == nil || m.Blocks == 0 || !w.HasSideGroups() {
		return m
	}
	bs := r.Model.BlockSize()
	maxTokens := len(r.Keys) * bs
	if len(req.Tokens) > 0 {
		maxTokens = len(req.Tokens) - 1
	}
	r.keysReq = req
	t, by := w.Cap(m.Blocks*bs, maxTokens, r.keysAtFn)
	// Only a group's rule caps: a prompt's last token alone shortens a
	// hybrid worker's hit no more than a full-attention worker's.
	if b := t / bs; by >= 0 && b < m.Blocks {
		m.Prefix, m.CappedBy, m.Blocks = m.Blocks, by, b
		for i := range m.ByMedium {
			m.ByMedium[i] = min(m.ByMedium[i], b)
		}
	}
	return m
}

// CapGroup returns the KV-cache group that capped c's match (see
// indexer.Match.CappedBy), when one did.
func (r *Result) CapGroup(c *Candidate) (indexer.Group, bool) {
	if c.Match.Prefix == 0 || int(c.Match.Worker) >= len(r.tab.workers) {
		return indexer.Group{}, false
	}
	if w := r.tab.workers[c.Match.Worker]; w != nil {
		return w.Group(c.Match.CappedBy)
	}
	return indexer.Group{}, false
}

// keysAt returns the prompt's keys at block size bs, for Cap: the
// request's keys at the model's block size, else the tokens keyed anew
// (kept for the call), else nil.
func (r *Result) keysAt(bs int) []indexer.Key {
	if bs == r.Model.BlockSize() {
		return r.Keys
	}
	if len(r.keysReq.Tokens) == 0 {
		return nil
	}
	for i := range r.altKeys {
		if r.altKeys[i].bs == bs {
			return r.altKeys[i].keys
		}
	}
	k := indexer.PromptKeys(r.Model.Name, bs, r.keysReq.Tokens, r.keysReq.Extras, nil)
	r.altKeys = append(r.altKeys, altKeys{bs: bs, keys: k})
	return k
}

// altKeys are a prompt's keys at a block size other than its model's.
type altKeys struct {
	bs   int
	keys []indexer.Key
}

// add lists a worker for ranking once.
func (r *Result) add(m indexer.Match) {
	r.listed[m.Worker] = true
	id := m.Worker
	r.Ranked = append(r.Ranked, Candidate{
		Match:  m,
		Ref:    r.tab.refs[id],
		Gen:    r.tab.gens[id],
		Health: r.tab.health[id].Load(),
	})
}

// markCandidates records the request's candidate workers, checking that
// each is a worker of the model.
func (r *Result) markCandidates(refs []events.WorkerRef) error {
	if len(refs) == 0 {
		return nil
	}
	r.filtered = true
	for i, ref := range refs {
		if ref.Pod == "" {
			return badField(fmt.Sprintf("workers[%d].pod", i), "required")
		}
		id, ok := r.tab.byRef[ref]
		if !ok {
			return badField(fmt.Sprintf("workers[%d]", i), "unknown worker %s for model %s", quote.S(ref.String()), quote.Q(r.Model.Name))
		}
		if m := r.tab.models[id]; m != r.Model {
			return badField(fmt.Sprintf("workers[%d]", i), "unknown worker %s for model %s (it serves %s)", quote.S(ref.String()), quote.Q(r.Model.Name), quote.Q(m.Name))
		}
		if r.state[id] == notCandidate {
			r.state[id] = candidate
			r.cands = append(r.cands, id)
		}
	}
	return nil
}

// markLoads indexes the request's loads, checking each names a worker of
// the model and a usage in [0, 1].
func (r *Result) markLoads(loads []RequestLoad) error {
	for i := range loads {
		wl := &loads[i]
		id, ok := r.tab.byRef[wl.Worker]
		if !ok || r.tab.models[id] != r.Model {
			return badField(fmt.Sprintf("loads[%d].worker", i), "unknown worker %s for model %s", quote.S(wl.Worker.String()), quote.Q(r.Model.Name))
		}
		if u := wl.KVUsage; u < 0 || u > 1 || math.IsNaN(u) {
			return badField(fmt.Sprintf("loads[%d].kv_cache_usage", i), "%v is not in [0, 1]", u)
		}
		if r.loadAt[id] == 0 {
			r.loaded = append(r.loaded, id)
		}
		r.loadAt[id] = int32(i + 1)
	}
	return nil
}

// loadOf fills a candidate's load: the request's figures or else a fresh
// scrape, plus kvindex's in-flight accounting. Cost: atomic loads only.
func (s *Scorer) loadOf(req *Request, res *Result, c *Candidate, now time.Time) {
	id := c.Match.Worker
	l := &c.Load
	if at := res.loadAt[id]; at > 0 {
		wl := &req.Loads[at-1]
		l.Running, l.Waiting, l.KVUsage, l.QueuedPrefillTokens = wl.Running, wl.Waiting, wl.KVUsage, wl.QueuedPrefillTokens
		l.Source = "request"
	} else if sl, ok := res.tab.loads[id].Load(now); ok {
		l.Running, l.Waiting, l.KVUsage = sl.Running, sl.Waiting, sl.KVUsage
		l.Source = "scrape"
	}
	l.InflightRequests, l.InflightPrefillTokens = s.tracker.Load(id, res.tab.gens[id])
	if w := res.tab.workers[id]; w != nil {
		l.ResidentBlocks = uint64(max(w.PoolBlocks(), 0))
	}
}

// prompt describes the request for the policy; now is the tracker's clock.
func (s *Scorer) prompt(req *Request, res *Result, now time.Time) Prompt {
	bs := req.Model.BlockSize()
	st := s.stats(req.Model)
	pr := Prompt{
		Blocks:            len(res.Keys),
		Tokens:            max(len(req.Tokens), len(res.Keys)*bs),
		BlockSize:         bs,
		AvgPromptTokens:   math.Float64frombits(s.avgPrompt.Load()),
		AvgUncachedTokens: math.Float64frombits(st.avgOwn.Load()),
		ArrivalRate:       st.routes.rate(now),
		Workers:           res.tab.perModel[req.Model],
	}
	pr.SharedDepths = st.shared.fill(res.Keys, now, &pr.SharedRates)
	return pr
}

// Route ranks like Score with every allowed worker of the model listed,
// chooses the best one, or pick when not nil (any worker of the model,
// even stale or filtered out), and records the choice under request id for
// owner (only owner may release it): the prompt's blocks count as
// speculatively cached there, and its uncached prefill as in-flight load,
// until Release. It returns the chosen worker's index in res.Ranked.
//
// Errors: a *RequestError; ErrNoWorker; ErrDuplicateRequest;
// ErrTooManyFlights.
func (s *Scorer) Route(id, owner string, req *Request, pick *events.WorkerRef, res *Result) (int, error) {
	if id == "" {
		return -1, badField("request_id", "required")
	}
	if req.Model == nil {
		res.reset()
		return -1, badField("model", "required")
	}
	st := s.stats(req.Model)
	st.mu.Lock()
	defer st.mu.Unlock()
	all := req.All
	req.All = true
	err := s.rank(req, res)
	req.All = all
	if err != nil {
		res.reset()
		return -1, err
	}
	chosen := -1
	if pick != nil {
		wid, ok := res.tab.byRef[*pick]
		if !ok || res.tab.models[wid] != req.Model {
			res.reset()
			return -1, badField("pick", "unknown worker %s for model %s", quote.S(pick.String()), quote.Q(req.Model.Name))
		}
		chosen = res.indexOf(wid)
		if chosen < 0 { // a stale or filtered-out worker the router chose anyway
			res.add(indexer.Match{Worker: wid})
			s.loadOf(req, res, &res.Ranked[len(res.Ranked)-1], time.Now())
			res.Policy.Rank(res.Prompt, res.Ranked, res.tab.refs)
			chosen = res.indexOf(wid)
		}
	} else if len(res.Ranked) > 0 {
		chosen = 0
	}
	if chosen < 0 {
		name := req.Model.Name
		res.reset()
		return -1, fmt.Errorf("%w: no worker of model %s is available (all stale or none configured)", ErrNoWorker, quote.Q(name))
	}
	c := &res.Ranked[chosen]
	if err := s.tracker.Record(id, owner, c.Match.Worker, c.Gen, res.Keys, uint64(c.Own)); err != nil {
		res.reset()
		return -1, err
	}
	st.note(s.tracker.now(), res.Keys, c.Own)
	return chosen, nil
}

// indexOf returns worker id's index in r.Ranked, or -1.
func (r *Result) indexOf(id indexer.WorkerID) int {
	return slices.IndexFunc(r.Ranked, func(c Candidate) bool { return c.Match.Worker == id })
}

// Release ends request id's in-flight accounting, if owner routed it.
func (s *Scorer) Release(id, owner string) (bool, error) { return s.tracker.Release(id, owner) }
