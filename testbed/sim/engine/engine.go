package engine

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// TimeModel gives the duration of an engine step (terms and defaults in
// the package doc; AttentionPairsPerSec 0: no attention term).
type TimeModel struct {
	PrefillTokensPerSec   float64
	AttentionPairsPerSec  float64
	StepOverhead          time.Duration
	DecodePerSeq          time.Duration
	DecodePerContextToken time.Duration
}

// DefaultTimeModel returns the documented defaults (8B model, one H100).
func DefaultTimeModel() TimeModel {
	return TimeModel{
		PrefillTokensPerSec:   17500,
		AttentionPairsPerSec:  9.4e8,
		StepOverhead:          6 * time.Millisecond,
		DecodePerSeq:          100 * time.Microsecond,
		DecodePerContextToken: 39 * time.Nanosecond,
	}
}

// StepTime is the duration of a step that prefills prefill tokens
// attending over pairs (new, context) token pairs and decodes decodeSeqs
// requests holding contextTokens tokens in all.
func (t TimeModel) StepTime(prefill int, pairs int64, decodeSeqs int, contextTokens int64) time.Duration {
	d := t.StepOverhead + time.Duration(decodeSeqs)*t.DecodePerSeq + time.Duration(contextTokens)*t.DecodePerContextToken
	if prefill > 0 {
		d += time.Duration(float64(prefill) / t.PrefillTokensPerSec * float64(time.Second))
	}
	if t.AttentionPairsPerSec > 0 && pairs > 0 {
		d += time.Duration(float64(pairs) / t.AttentionPairsPerSec * float64(time.Second))
	}
	return d
}

// AttentionPairs is how many (new token, context token) pairs a prefill
// chunk of n tokens after ctx computed tokens attends over, causally.
func AttentionPairs(n, ctx int) int64 {
	return int64(n)*int64(ctx) + int64(n)*int64(n+1)/2
}

// Config sets up an Engine; zero fields take the package doc's defaults.
type Config struct {
	BlockSize int // tokens per KV block (vLLM's --block-size; default Layout.BlockSize, else 16)
	// CacheBlocks is the pool of KV blocks every group allocates from (a
	// hybrid model uses a block per group at each token position).
	CacheBlocks int
	Layout      Layout // the model's KV-cache groups (zero: one full-attention group)
	// MaxNumSeqs and MaxBatchedTokens are vLLM's max_num_seqs and
	// max_num_batched_tokens.
	MaxNumSeqs, MaxBatchedTokens int
	Time                         TimeModel
	HashSeed                     uint64 // of the engine's block hashes (vLLM's hash seed)
	Events                       bool   // FinishStep returns each step's KV events
	OutputSeed                   uint64 // mixed into the content ids of generated tokens
}

// Defaults fills the zero fields of c.
func (c *Config) Defaults() {
	c.BlockSize = cmp.Or(c.BlockSize, c.Layout.BlockSize, 16)
	c.CacheBlocks = cmp.Or(c.CacheBlocks, 25000)
	c.MaxNumSeqs = cmp.Or(c.MaxNumSeqs, 256)
	c.MaxBatchedTokens = cmp.Or(c.MaxBatchedTokens, 8192)
	c.Time = cmp.Or(c.Time, DefaultTimeModel())
}

// ErrConfig is wrapped by errors about an invalid Config.
var ErrConfig = errors.New("engine: invalid config")

func (c *Config) validate() error {
	switch {
	case c.BlockSize <= 0:
		return fmt.Errorf("%w: block size %d", ErrConfig, c.BlockSize)
	case c.CacheBlocks <= 0:
		return fmt.Errorf("%w: cache of %d blocks", ErrConfig, c.CacheBlocks)
	case c.MaxNumSeqs <= 0 || c.MaxBatchedTokens <= 0:
		return fmt.Errorf("%w: max_num_seqs %d, max_num_batched_tokens %d", ErrConfig, c.MaxNumSeqs, c.MaxBatchedTokens)
	case c.Time.PrefillTokensPerSec <= 0:
		return fmt.Errorf("%w: prefill rate %v tokens/s", ErrConfig, c.Time.PrefillTokensPerSec)
	case c.Time.AttentionPairsPerSec < 0:
		return fmt.Errorf("%w: attention rate %v pairs/s", ErrConfig, c.Time.AttentionPairsPerSec)
	case c.Layout.hasMamba() && c.MaxBatchedTokens < c.BlockSize:
		// Mamba's aligned prefill chunks need a block's worth of budget.
		return fmt.Errorf("%w: max_num_batched_tokens %d below the block size %d of a mamba layout", ErrConfig, c.MaxBatchedTokens, c.BlockSize)
	}
	return c.Layout.validate()
}

// seq is one request on the engine.
type seq struct {
	req *workload.Request
	out workload.Segment
	// hashes chain every full block of the prompt followed by the output.
	hashes []uint64
	// g holds the request's blocks in each KV-cache group.
	g []groupBlocks
	// computed counts tokens computed or hit.
	computed    int
	generated   int
	chunk       int // tokens scheduled in the current step
	estUncached int // uncached prompt tokens on arrival, for Load
	hitTokens   int // the prefix hit when first scheduled
	scheduled   bool
}

// target is the sequence length whose last token the next sample follows.
func (s *seq) target() int { return s.req.PromptLen + s.generated }

// Stats are an engine's counters.
type Stats struct {
	Rejected      int   // requests that could never fit
	PrefillTokens int64 // prompt tokens computed, recomputation included
	Preemptions   int   // requests preempted for lack of blocks
	Steps         int64
}

// Load is what a router may learn about an engine's load: vLLM's
// num_requests_running, num_requests_waiting and kv_cache_usage_perc.
type Load struct {
	Running, Waiting int
	KVUsage          float64
	// QueuedPrefill is prompt tokens still to prefill (running prefills'
	// rest, waiting prompts' uncached tokens on arrival). vLLM exports
	// nothing like it: only ttft-greedy may use it.
	QueuedPrefill int64
}

// FirstToken reports a request's first token and the prefix it hit when
// first scheduled.
type FirstToken struct {
	Req          *workload.Request
	CachedTokens int
}

// StepResult is what one step produced: its slices are reused by the
// next FinishStep, Batch (nil: no events) until the next StartStep.
type StepResult struct {
	FirstTokens []FirstToken
	Finished    []*workload.Request
	Batch       *events.Batch
}

// Engine is one simulated vLLM engine.
type Engine struct {
	id     int
	cfg    Config
	p      *pool
	groups []Group // cfg.Layout's, or the one full-attention group
	mamba  bool    // a mamba group: prefill chunks end on block boundaries

	waiting []*seq // FIFO; head first
	running []*seq // arrival order

	inStep  bool
	stepEnd time.Duration

	// the current step's KV events, in order, and their backing arrays
	evs    []events.Event
	evHash []uint64
	evToks []uint32
	batch  events.Batch
	result StepResult

	stats Stats
}

// New returns an engine with an empty cache. id names it in errors.
func New(id int, cfg Config) (*Engine, error) {
	cfg.Defaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("engine %d: %w", id, err)
	}
	groups := cfg.Layout.groups()
	e := &Engine{id: id, cfg: cfg, p: newPool(cfg.CacheBlocks, len(groups)), groups: groups, mamba: cfg.Layout.hasMamba()}
	if cfg.Events {
		announce := cfg.Layout.announces()
		e.p.onEvict = func(h uint64, g int) {
			e.evHash = append(e.evHash, h)
			n := len(e.evHash)
			e.evs = append(e.evs, events.Event{Kind: events.KindBlockRemoved, BlockHashes: e.evHash[n-1 : n : n], MediumName: "GPU",
				GroupIdx: g, HasGroupIdx: announce})
		}
	}
	e.batch.HasDPRank = true
	return e, nil
}

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats { return e.stats }

// BlockHashes appends the engine's chained hashes of the full blocks of
// content (ids from workload.Request.AppendBlockContent).
func (e *Engine) BlockHashes(dst []uint64, content []uint64) []uint64 {
	h := workload.Mix64(e.cfg.HashSeed ^ 0x76_6c_6c_6d) // "vllm"
	for _, c := range content {
		h = workload.Mix64(h ^ workload.Mix64(c))
		dst = append(dst, h)
	}
	return dst
}

// Fits reports whether a request's whole sequence fits in an empty cache:
// every group's most blocks held at once (peakBlocks) together.
func (e *Engine) Fits(req *workload.Request) bool {
	n := 0
	for _, g := range e.groups {
		n += e.peakBlocks(g, req.PromptLen+req.OutputLen)
	}
	return n <= e.cfg.CacheBlocks
}

func blocksFor(tokens, bs int) int { return (tokens + bs - 1) / bs }

// Submit queues a request of content ids over its prompt and output
// (AppendBlockContent with OutputSegment; not kept). It returns false,
// counting a rejection, when the request could never fit the cache.
func (e *Engine) Submit(req *workload.Request, content []uint64) bool {
	if !e.Fits(req) {
		e.stats.Rejected++
		return false
	}
	s := &seq{req: req, out: req.OutputSegment(e.cfg.OutputSeed), g: make([]groupBlocks, len(e.groups))}
	s.hashes = e.BlockHashes(make([]uint64, 0, len(content)), content)
	s.estUncached = req.PromptLen - e.cachedPrefix(s.hashes, req.PromptLen)*e.cfg.BlockSize
	e.waiting = append(e.waiting, s)
	return true
}

// cachedPrefix is the prefix hit in blocks of a request of hashes and
// tokens tokens: HybridHit over the layout, at most (tokens-1)/BlockSize.
func (e *Engine) cachedPrefix(hashes []uint64, tokens int) int {
	limit := min(len(hashes), (tokens-1)/e.cfg.BlockSize)
	if m, _ := managerOf(e.groups[0].Kind); len(e.groups) == 1 && m == managerFull {
		// One full-attention group (group 0: its keys are the hashes),
		// without HybridHit's closures.
		n := 0
		for n < limit && e.p.lookup(hashes[n]) != none {
			n++
		}
		return n
	}
	return HybridHit(e.groups, e.cfg.BlockSize, limit, func(g, i int) bool { return e.p.lookup(blockKey(hashes[i], g)) != none })
}

// CachedTokens is how many prompt tokens of a request of hashes (from
// BlockHashes) would hit if scheduled now.
func (e *Engine) CachedTokens(hashes []uint64, promptLen int) int {
	return e.cachedPrefix(hashes, promptLen) * e.cfg.BlockSize
}

// Load returns the engine's current load. Cost: O(queued requests).
func (e *Engine) Load() Load {
	l := Load{Running: len(e.running), Waiting: len(e.waiting), KVUsage: float64(e.p.inUse()) / float64(len(e.p.blocks))}
	for _, s := range e.running {
		if s.computed < s.req.PromptLen {
			l.QueuedPrefill += int64(s.req.PromptLen - s.computed)
		}
	}
	for _, s := range e.waiting {
		l.QueuedPrefill += int64(s.estUncached)
	}
	return l
}

// Idle reports whether nothing is running or waiting.
func (e *Engine) Idle() bool { return len(e.waiting) == 0 && len(e.running) == 0 }

// InStep reports whether a step is between StartStep and FinishStep.
func (e *Engine) InStep() bool { return e.inStep }

// StartStep schedules the next step at now and returns its duration, or
// false with nothing to schedule. Its KV events happen here, as vLLM
// collects them while scheduling, and FinishStep returns them.
func (e *Engine) StartStep(now time.Duration) (d time.Duration, ok bool) {
	if e.inStep {
		panic(fmt.Sprintf("engine %d: StartStep during a step", e.id))
	}
	e.evs, e.evHash, e.evToks = e.evs[:0], e.evHash[:0], e.evToks[:0]
	prefill, pairs, decodes, ctx := e.schedule()
	if prefill == 0 && decodes == 0 {
		return 0, false
	}
	d = e.cfg.Time.StepTime(prefill, pairs, decodes, ctx)
	e.inStep, e.stepEnd = true, now+d
	e.stats.PrefillTokens += int64(prefill)
	e.stats.Steps++
	return d, true
}

// schedule builds one step (running requests, then waiting ones) and
// returns its prefill tokens, their attention pairs, the decoding
// requests and their context.
func (e *Engine) schedule() (prefill int, pairs int64, decodes int, ctx int64) {
	budget := e.cfg.MaxBatchedTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		need := min(s.target()-s.computed, budget)
		if e.mamba {
			if need = e.alignSplit(s, s.computed, need); need == 0 {
				continue // no block-aligned chunk fits the budget left
			}
		}
		for !e.grow(s, need) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if i >= len(e.running) || e.running[i] != s {
			break // s itself was preempted
		}
		s.chunk = need
		budget -= need
		e.cacheFull(s)
		if s.generated > 0 && need == 1 && s.computed == s.target()-1 {
			decodes++
			ctx += int64(s.computed)
		} else {
			prefill += need
			pairs += AttentionPairs(need, s.computed)
		}
	}
	if preempted {
		return prefill, pairs, decodes, ctx
	}
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs && budget > 0 {
		s := e.waiting[0]
		hit := e.cachedPrefix(s.hashes, s.target())
		hitTokens := hit * e.cfg.BlockSize
		need := min(s.target()-hitTokens, budget)
		if e.mamba {
			if need = e.alignSplit(s, hitTokens, need); need == 0 {
				break
			}
		}
		if e.admitBlocks(s, hit, hitTokens+need) > e.p.numFree {
			break
		}
		e.touchHit(s, hit)
		s.computed = hitTokens
		if !s.scheduled {
			s.scheduled = true
			s.hitTokens = min(hitTokens, s.req.PromptLen)
		}
		if !e.grow(s, need) {
			panic(fmt.Sprintf("engine %d: admission checked %d free blocks but allocation failed", e.id, e.p.numFree))
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		s.chunk = need
		budget -= need
		prefill += need
		pairs += AttentionPairs(need, s.computed)
		e.cacheFull(s)
	}
	return prefill, pairs, decodes, ctx
}

// grow frees the blocks s no longer needs, then allocates the blocks it
// needs for need more tokens in every group, or nothing and false when
// too few are free (vLLM's allocate_slots).
func (e *Engine) grow(s *seq, need int) bool {
	tokens := s.computed + need
	more := 0
	for g := range e.groups {
		e.removeSkipped(s, g)
		more += e.newBlocks(s, g, tokens)
	}
	if more > e.p.numFree {
		return false
	}
	for g := range e.groups {
		e.allocate(s, g, tokens)
	}
	return true
}

// preempt frees a running request's blocks and requeues it at the head.
func (e *Engine) preempt(s *seq) {
	e.freeBlocks(s)
	s.computed, s.chunk = 0, 0
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = s
	e.stats.Preemptions++
}

// freeBlocks releases s's blocks group by group, each in reverse order
// (its tail evicted first), as vLLM's coordinator frees a request.
func (e *Engine) freeBlocks(s *seq) {
	for g := range s.g {
		gb := &s.g[g]
		for i := len(gb.blocks) - 1; i >= 0; i-- {
			if gb.blocks[i] != none {
				e.p.release(gb.blocks[i])
			}
		}
		*gb = groupBlocks{blocks: gb.blocks[:0], lastState: none}
	}
}

// FinishStep completes the step at now, its end: scheduled tokens are
// computed, complete sequences sample a token, finished requests free
// their blocks.
func (e *Engine) FinishStep(now time.Duration) *StepResult {
	if !e.inStep {
		panic(fmt.Sprintf("engine %d: FinishStep without a step", e.id))
	}
	e.inStep = false
	r := &e.result
	r.FirstTokens, r.Finished, r.Batch = r.FirstTokens[:0], r.Finished[:0], nil
	kept := e.running[:0]
	for _, s := range e.running {
		if s.chunk > 0 {
			s.computed += s.chunk
			s.chunk = 0
			if s.computed == s.target() {
				s.generated++
				if s.generated == 1 {
					r.FirstTokens = append(r.FirstTokens, FirstToken{Req: s.req, CachedTokens: s.hitTokens})
				}
				if s.generated >= s.req.OutputLen {
					e.freeBlocks(s)
					r.Finished = append(r.Finished, s.req)
					continue
				}
			}
		}
		kept = append(kept, s)
	}
	clear(e.running[len(kept):])
	e.running = kept
	if len(e.evs) > 0 {
		e.batch.Timestamp = now.Seconds()
		e.batch.Events = e.evs
		r.Batch = &e.batch
	}
	return r
}

// CachedBlocks is the number of distinct (hash, group) pairs cached: what
// kvindex should hold for the engine once every event is applied.
func (e *Engine) CachedBlocks() int { return e.p.cached.len() }

// CachedBlocksIn is the number of distinct hashes group g caches.
func (e *Engine) CachedBlocksIn(g int) int { return e.p.perGroup[g] }

// Groups returns the engine's KV-cache groups in group_idx order (the zero
// Layout's one full-attention group included); the caller must not modify
// them.
func (e *Engine) Groups() []Group { return e.groups }
